"""One compare grid: ``tba-ext compare`` with the grid's options, its JSON with how and where it was made.

    python benchmarks/compare_grid.py [--task arith20] [--seeds 0 1 2] [--staleness 0 10] [--methods ...]
    python benchmarks/compare_grid.py --merge a.json b.json ... --out OUT.json --run-dir DIR

benchmarks/evidence.py runs every study of the compare page through it, one process per seed, and merges them.
Writes the JSON (per method and staleness: gain_mean, gain_sd, gain_ci95, n_seeds, ...; the seed-paired
differences), and report.md with held-out accuracy vs updates and vs wall-clock (mean, 95 % band; PNG) in --run-dir.
"""

import argparse
import sys

from common import provenance

from tba_ext.cli import staleness_arg
from tba_ext.tools.compare import compare, merge
from tba_ext.tools.recipe import COMPARED, FULL, METHODS, TASK_RECIPES
from tba_ext.tools.report import write_json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=list(TASK_RECIPES), default=FULL.task)  # the quickstart's
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--staleness", type=staleness_arg, nargs="+", default=[0, 4, 10])  # ints or mix
    parser.add_argument("--methods", nargs="+", default=list(COMPARED), choices=list(METHODS))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--run-dir", default="benchmarks/results/compare_run")
    parser.add_argument("--out", default="benchmarks/results/compare_run/grid.json")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="merge these compare results instead of running")
    args = parser.parse_args()
    if args.merge:
        payload = merge(args.merge, args.run_dir, args.out)
    else:
        payload = grid(args)
    payload["how"] = "benchmarks/compare_grid.py " + " ".join(sys.argv[1:])
    payload["provenance"] = provenance()  # where and on what code the grid (or the merge) was made
    write_json(payload, args.out)


def grid(args) -> dict:
    return compare(
        args.run_dir,
        seeds=args.seeds,
        staleness=args.staleness,
        methods=args.methods,
        steps=args.steps,
        eval_every=args.eval_every,
        results_path=args.out,
        task=args.task,
    )


if __name__ == "__main__":
    main()
