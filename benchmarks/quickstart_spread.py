"""Seed-to-seed spread of the full CPU quickstart: is the held-out gain larger than the spread between seeds?

    python benchmarks/quickstart_spread.py [--seeds 0 1 2] [--out benchmarks/results/quickstart_spread.json]

Each seed is a complete ``tba-ext quickstart`` (its own model init, data order, warm start and TBA run).
Reported: per seed before/after held-out accuracy, wall time; mean gain and the standard deviation of the
after-accuracy and of the gain across seeds. JSON + PNG (before/after per seed).
"""

import argparse
import json
import os
import statistics

from tba_ext import report
from tba_ext.quickstart import quickstart


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--run-dir", default="benchmarks/results/quickstart_spread_runs")
    parser.add_argument("--out", default="benchmarks/results/quickstart_spread.json")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        print(f"=== quickstart seed {seed}", flush=True)
        s = quickstart(os.path.join(args.run_dir, f"seed{seed}"), seed=seed)
        runs.append({k: s[k] for k in ("seed", "accuracy_before", "accuracy_after", "total_seconds", "rl_seconds")})
    gains = [r["accuracy_after"] - r["accuracy_before"] for r in runs]
    result = {
        "runs": runs,
        "gain_mean": statistics.mean(gains),
        "gain_std": statistics.stdev(gains) if len(gains) > 1 else None,
        "before_std": statistics.stdev([r["accuracy_before"] for r in runs]) if len(runs) > 1 else None,
        "after_std": statistics.stdev([r["accuracy_after"] for r in runs]) if len(runs) > 1 else None,
        "gains_positive": sum(g > 0 for g in gains),
        "max_total_seconds": max(r["total_seconds"] for r in runs),
        "goals": {"gain_mean > gain_std": True, "max_total_seconds": 600},
    }
    report.ensure_dir(os.path.dirname(os.path.abspath(args.out)))
    report.write_json(result, args.out)
    print(json.dumps(result, indent=2))
    plot(runs, args.out.replace(".json", ".png"))


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in runs:
        ax.plot([0, 1], [r["accuracy_before"], r["accuracy_after"]], marker="o", label=f"seed {r['seed']}")
    ax.set_xticks([0, 1], ["after warm start", "after TBA"])
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
