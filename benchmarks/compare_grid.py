"""The evidence grid : TB, TBA′ and Dr. GRPO x staleness {0, 4, 10} x seeds {0, 1, 2} on the CPU recipe
(tba_ext/tools/recipe.py), each run from the same warm start per seed. Hours on 2 cores.

    python benchmarks/compare_grid.py [--seeds 0 1 2] [--staleness 0 4 10] [--steps 60]

Runs on separate seeds can go in parallel processes (each with its own --run-dir and --out), then
``--merge a.json b.json ...`` writes the grid's JSON, plots and table from them.

Writes benchmarks/results/compare.json (per method and staleness: gain_mean, gain_sd, gain_ci95, n_seeds, ...),
and the run folder's report.md with held-out accuracy vs updates and vs wall-clock (mean, 95 % band; PNG).
"""

import argparse
import sys

from common import provenance

from tba_ext.tools.compare import compare, merge
from tba_ext.tools.recipe import COMPARED, FULL, METHODS, TASK_RECIPES
from tba_ext.tools.report import write_json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=list(TASK_RECIPES), default=FULL.task)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 4, 10])
    parser.add_argument("--methods", nargs="+", default=list(COMPARED), choices=list(METHODS))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--run-dir", default="benchmarks/results/compare_run")
    parser.add_argument("--out", default="benchmarks/results/compare.json")
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
