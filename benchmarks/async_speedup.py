"""Colocated sync vs decoupled TBA on the same CPUs, for the same number of trained samples.

    python benchmarks/async_speedup.py [--steps 10] [--out benchmarks/results/async_speedup.json]

Both runs train the same tiny model on the same data with the tb loss and the TBA replay sampler:
- sync: `cpu_tba` with trainer_mode=tba_sync (generation, then training, then weight sync, in turn);
- decoupled: `cpu_tba_decoupled` (a searcher replica generates while the trainer trains; weights every k=2).
Reports the wall-clock ratio, trainer idle ratio (time the trainer waits for data / step time), and the ideal
overlap ratio (gen + train) / max(gen, train) computed from the sync run's own timings. JSON + table + PNG
timeline (per step: trainer waiting vs computing, and searcher busy fraction).
"""

import json
import os
import time

from tba_ext import report
from tba_ext.launch import run_verl

from common import parse_args, prepare_run


def main():
    args = parse_args("async_speedup", steps=10)
    run = prepare_run(args.run_dir, train_size=1000)
    common = [f"run_dir={run}", f"trainer.total_training_steps={args.steps}", "data.train_batch_size=16",
              "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    runs = {}
    for name, config, extra in (
        ("sync", "cpu_tba", ["trainer.v1.trainer_mode=tba_sync"]),
        ("decoupled", "cpu_tba_decoupled", []),
    ):
        metrics = f"{run}/{name}.jsonl"
        start = time.time()
        run_verl(config, common + extra, log_path=f"{run}/{name}.log", metrics_path=metrics)
        records = report.read_metrics(metrics)
        runs[name] = {"records": records, "launch_wall_s": time.time() - start}
    summary = {}
    for name, r in runs.items():
        d = [x["data"] for x in r["records"][1:]]  # skip step 1 (warm-up)
        step = sum(x["timing_s/step"] for x in d)
        summary[name] = {
            "train_wall_s": step,
            "launch_wall_s": r["launch_wall_s"],
            "trainer_idle_ratio": sum(x["timing_s/gen"] for x in d) / step,
            "gen_s": sum(x["timing_s/gen"] for x in d),
            "train_s": step - sum(x["timing_s/gen"] for x in d),
            "searcher_idle_ratio": (sum(x.get("tba/searcher_idle_ratio", 0.0) for x in d) / len(d)),
        }
    sync = summary["sync"]
    ideal = (sync["gen_s"] + sync["train_s"]) / max(sync["gen_s"], sync["train_s"])
    result = {
        "steps_measured": args.steps - 1,
        "runs": summary,
        "speedup_decoupled_over_sync": sync["train_wall_s"] / summary["decoupled"]["train_wall_s"],
        "ideal_overlap_ratio": ideal,
        "fraction_of_ideal": (sync["train_wall_s"] / summary["decoupled"]["train_wall_s"]) / ideal,
        "goals": {"fraction_of_ideal": 0.9, "trainer_idle_ratio_decoupled": 0.1},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'run':<10} | {'wall (s)':>8} | {'trainer idle':>12} | {'searcher idle':>13}")
    for name, s in summary.items():
        print(f"{name:<10} | {s['train_wall_s']:>8.1f} | {s['trainer_idle_ratio']:>12.2f} | {s['searcher_idle_ratio']:>13.2f}")
    print(f"speedup {result['speedup_decoupled_over_sync']:.2f}x, ideal overlap {ideal:.2f}x "
          f"({result['fraction_of_ideal']:.2f} of ideal); written to {args.out}")
    timeline(runs, args.out.replace(".json", ".png"))


def timeline(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], runs.items()):
        t = 0.0
        for rec in r["records"]:
            d = rec["data"]
            wait, step = d["timing_s/gen"], d["timing_s/step"]
            ax.barh(1, wait, left=t, color="tab:orange")
            ax.barh(1, step - wait, left=t + wait, color="tab:blue")
            if "tba/searcher_idle_ratio" in d:  # measured between consecutive steps, so not on the first
                ax.barh(0, step * (1.0 - d["tba/searcher_idle_ratio"]), left=t, color="tab:green")
            t += step
        ax.set_yticks([0, 1], ["searcher busy", "trainer"])
        ax.set_xlabel("seconds")
        ax.set_title(f"{name}: trainer waiting (orange) / training (blue);\nsearcher busy share of each step (green)",
                     fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"timeline: {path}")


if __name__ == "__main__":
    main()
