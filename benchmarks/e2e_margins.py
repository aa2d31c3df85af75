"""How close the suite's numerical e2e checks come to their bounds: run them N times in a row, report the worst.

    python benchmarks/e2e_margins.py --repeats 5 [-k EXPR] [--out benchmarks/results/e2e_margins.json]

Each check records value and bound through the ``margin`` fixture (tests/conftest.py); a ratio of 1.0 is the
edge. Writes the per-check worst ratio over the repeats, every repeat's pass/fail and where the run was made.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from common import provenance

# the e2e tests with a numerical or statistical assertion
DEFAULT_SELECTION = (
    "test_two_data_parallel_ranks or test_dr_grpo_trains or kill_9 or tb_pg_weights_stale "
    "or reference_reset_in_its_own or free_running_searchers or quickstart_short "
    "or (rehearsed_on_cpu_validates and tldr)"
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-k", default=DEFAULT_SELECTION)
    parser.add_argument("--out", default="benchmarks/results/e2e_margins.json")
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        metavar="JSONL",
        help="margin records of earlier runs (TBA_EXT_MARGINS files, e.g. a CI run's) to count too",
    )
    parser.add_argument("--keep", default=None, metavar="JSONL", help="append this run's raw records here")
    args = parser.parse_args()

    meta = provenance()
    records, runs = [], []
    for repeat in range(args.repeats):
        path = tempfile.mktemp(prefix="tba_margins_", suffix=".jsonl")
        start = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "e2e", "-k", args.k],
            env=dict(os.environ, TBA_EXT_MARGINS=path),
            capture_output=True,
            text=True,
        )
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        runs.append(
            {"repeat": repeat, "returncode": proc.returncode, "seconds": round(time.time() - start), "summary": summary}
        )
        print(f"repeat {repeat + 1}/{args.repeats}: {summary} ({runs[-1]['seconds']} s)", flush=True)
        if proc.returncode:
            print(proc.stdout[-4000:], flush=True)
        if os.path.exists(path):
            new = [dict(json.loads(line), repeat=repeat) for line in open(path)]
            records += new
            if args.keep:
                with open(args.keep, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
            os.unlink(path)
    for extra in args.also:
        records += [dict(json.loads(line), source=extra) for line in open(extra)]

    worst = collections.OrderedDict()
    for r in records:
        key = f"{r['test']} :: {r['check']}"
        entry = worst.setdefault(key, {"worst_ratio": 0.0, "bound": r["bound"], "below": r["below"], "values": []})
        entry["values"].append(r["value"])
        entry["worst_ratio"] = max(entry["worst_ratio"], r["ratio"])
    result = {
        "how": f"{args.repeats} runs in a row of pytest -m e2e -k '{args.k}'"
        + (f", plus the records of {args.also}" if args.also else "")
        + "; ratio = value / bound for an "
        "upper bound, bound / value for a lower one (1.0 = the edge); worst over the repeats",
        "provenance": meta,
        "runs": runs,
        "checks": worst,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{'worst ratio':>11}  check")
    for key, entry in sorted(worst.items(), key=lambda kv: -kv[1]["worst_ratio"]):
        print(f"{entry['worst_ratio']:11.3g}  {key} (n={len(entry['values'])})")
    print(f"\nwrote {args.out}; {sum(r['returncode'] == 0 for r in runs)}/{len(runs)} repeats passed")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
