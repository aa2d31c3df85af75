"""Bad-input fuzzing at scale: the generator of the unit lane's ``tests/test_fuzz_inputs.py`` (``tests/fuzz_inputs.py``)
over more cases: bad configurations (wrong types, out-of-range values, misspelled keys, contradictory keys across
tba.*, algorithm.*, actor_rollout_ref.*, trainer.*, trainer.v1.*, sampler_kwargs.*, data.*) and malformed data rows,
each run through the checks ``tba-ext train`` runs before Ray starts (``check_overrides_are_read``, ``compose``,
``preflight``; no Ray).

    python benchmarks/fuzz_inputs.py [--cases 2000] [--seed 1] [--full-compose]
        [--out benchmarks/results/fuzz_inputs_run/fuzz_inputs.json]

Counts each end: refused naming the key (the only pass), refused without naming it, accepted silently, a
traceback from outside tba_ext (verl, omegaconf, hydra, pandas), an exception chain; lists every failure and exits 1
on any. ``--full-compose`` composes every case with hydra's own compose (slower) instead of applying the overrides
to a cached base with hydra's override code. The output folder (a ``_run`` folder: not committed, not rendered)
also holds the tiny model, the data and the broken files.
"""

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from common import provenance
from fuzz_inputs import NAMED, Checker, generate, template_counts

OUTCOMES = {
    "refused_named": "refused, naming the key or row",
    "refused_unnamed": "refused without naming the key or row",
    "accepted": "accepted silently",
    "outside_tba_ext": "a traceback from outside tba_ext, or an exception type the CLI does not report",
    "chained": "an exception chain",
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--full-compose", action="store_true", help="hydra's full compose for every case")
    parser.add_argument("--out", default="benchmarks/results/fuzz_inputs_run/fuzz_inputs.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    start_provenance = provenance()
    started = time.time()
    checker = Checker(out_dir)
    setup_s = time.time() - started
    cases = generate(args.cases, args.seed)
    counts = dict.fromkeys(OUTCOMES, 0)
    kinds: dict[str, dict[str, int]] = {}
    failures = []
    started = time.time()
    with contextlib.nullcontext() if args.full_compose else checker.fast_compose():
        for case in cases:
            result = checker.outcome(case)
            counts[result["outcome"]] += 1
            kind = "data" if case.data else "config"
            kinds.setdefault(kind, dict.fromkeys(OUTCOMES, 0))[result["outcome"]] += 1
            if result["outcome"] != NAMED:
                failures.append(
                    {"case": case.label, "config": case.config, "overrides": case.overrides, "names": case.names}
                    | result
                )
    elapsed = time.time() - started
    config_templates, data_templates = template_counts()
    doc = {
        "provenance": start_provenance,
        "args": vars(args),
        "templates": {"config": config_templates, "data": data_templates},
        "cases": len(cases),
        "counts": counts,
        "counts_by_kind": kinds,
        "outcomes": OUTCOMES,
        "setup_s": round(setup_s, 2),
        "checks_s": round(elapsed, 2),
        "per_case_ms": round(1000 * elapsed / max(len(cases), 1), 1),
        "failures": failures,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: doc[k] for k in ("cases", "counts", "counts_by_kind", "checks_s", "per_case_ms")}, indent=1))
    for failure in failures:
        print(f"FAIL {failure['outcome']}: {failure['case']} [{failure['config']}] -> {failure['error']}")
    print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
