"""Long-run stability: TBA (tb + replay, colocate_async) for many CPU steps; memory, buffer size, non-finite values.

    python benchmarks/long_run.py [--steps 200] [--capacity 2000] [--out benchmarks/results/long_run.json]

The replay store is capped at ``--capacity`` trajectories so it fills part-way through the run; after that
the resident memory of the whole run (verl driver + every Ray process of its session, summed) should stay
flat. Reported: RSS slope (MB per 100 steps) before and after the store is full, store size over steps, and
every non-finite metric value. JSON + PNG (RSS over steps, store size over steps).
"""

import json
import math
import os
import threading
import time

import numpy as np
import psutil
from common import parse_args, prepare_run

from tba_ext.tools import report
from tba_ext.tools.launch import run_verl
from tba_ext.tools.processes import children, cmdline, session_pids


class SessionRSS(threading.Thread):
    """Samples the summed RSS of the verl run this process started, every ``period`` seconds, with the
    number of steps finished by then (lines in verl's metrics file)."""

    def __init__(self, metrics_path: str, period: float = 2.0):
        super().__init__(daemon=True)
        self.metrics_path, self.period, self.samples, self.stop = metrics_path, period, [], threading.Event()

    def run(self):
        while not self.stop.wait(self.period):
            drivers = [p for p in children(os.getpid()) if "verl.trainer.main_ppo" in cmdline(p)]
            if not drivers:
                continue
            by_process: dict[str, float] = {}
            for pid in session_pids(drivers[0]):
                try:
                    label = process_label(pid)
                    by_process[label] = by_process.get(label, 0.0) + psutil.Process(pid).memory_info().rss / 2**20
                except psutil.Error:
                    continue
            try:
                with open(self.metrics_path) as f:
                    steps_done = sum(1 for line in f if line.strip())
            except OSError:
                steps_done = 0
            self.samples.append((steps_done, sum(by_process.values()), by_process))


def process_label(pid: int) -> str:
    """Ray workers by actor class (``ray::TaskRunnerV1``, ``ray::WorkerDict``...), others by program."""
    words = cmdline(pid).split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0].split(".")[0]
    return os.path.basename(
        words[1] if os.path.basename(words[0]).startswith("python") and len(words) > 1 else words[0]
    )


def slope_per_100_steps(steps, values) -> float | None:
    if len(steps) < 3:
        return None
    return float(np.polyfit(np.asarray(steps, float), np.asarray(values, float), 1)[0] * 100)


def main():
    args = parse_args(
        "long_run",
        steps=200,
        extra=lambda p: p.add_argument("--capacity", type=int, default=300, help="replay store cap (trajectories)"),
    )
    run = prepare_run(args.run_dir, train_size=2000)
    metrics = f"{run}/metrics.jsonl"
    if os.path.exists(metrics):
        os.remove(metrics)
    sampler = SessionRSS(metrics)
    sampler.start()
    start = time.time()
    run_verl(
        "cpu_tba",
        [
            f"run_dir={run}",
            f"trainer.total_training_steps={args.steps}",
            f"trainer.v1.sampler.sampler_kwargs.capacity={args.capacity}",
        ],
        log_path=f"{run}/verl.log",
        metrics_path=metrics,
    )
    sampler.stop.set()
    wall = time.time() - start

    records = report.read_metrics(metrics)
    nonfinite = [
        {"step": r["step"], "key": k, "value": str(v)}
        for r in records
        for k, v in r["data"].items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    steps = [r["step"] for r in records]
    store = [r["data"]["replay/store_trajectories"] for r in records]
    # from the first finished step until the last one (the final sample is taken while the run shuts down)
    samples = [x for x in sampler.samples if 1 <= x[0] < len(records)]
    rss_steps, rss = [n for n, _, _ in samples], [mb for _, mb, _ in samples]
    full_at = next((s for s, n in zip(steps, store) if n >= args.capacity), None)
    after = [(s, m) for s, m in zip(rss_steps, rss) if full_at is not None and s >= full_at]
    before = [(s, m) for s, m in zip(rss_steps, rss) if full_at is None or s < full_at]
    # which processes grow: per-process slope over the samples after the store is full (or all of them)
    window = [x for x in samples if full_at is None or x[0] >= full_at]
    labels = sorted({k for _, _, by in window for k in by})
    per_process = {}
    for label in labels:
        pts = [(n, by[label]) for n, _, by in window if label in by]
        if len(pts) > 2:
            per_process[label] = {"mb_last": pts[-1][1], "slope_mb_per_100_steps": slope_per_100_steps(*zip(*pts))}
    result = {
        "steps": len(records),
        "wall_s": wall,
        "replay_capacity": args.capacity,
        "store_full_at_step": full_at,
        "store_final": store[-1],
        "rss_mb_first": rss[0] if rss else None,
        "rss_mb_last": rss[-1] if rss else None,
        "rss_mb_max": max(rss) if rss else None,
        "rss_slope_mb_per_100_steps_before_full": slope_per_100_steps(*zip(*before)) if len(before) > 2 else None,
        "rss_slope_mb_per_100_steps_after_full": slope_per_100_steps(*zip(*after)) if len(after) > 2 else None,
        "per_process": per_process,
        "nonfinite_values": nonfinite,
        "goals": {"rss_slope_mb_per_100_steps_after_full": "about 0 (flat)", "nonfinite_values": "none"},
    }
    report.write_json(dict(result, rss_samples=list(zip(rss_steps, rss)), store=list(zip(steps, store))), args.out)
    print(json.dumps(result, indent=2))
    plot(rss_steps, rss, steps, store, full_at, args.out.replace(".json", ".png"))


def plot(rss_steps, rss, steps, store, full_at, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.5))
    a.plot(rss_steps, rss)
    a.set_xlabel("step")
    a.set_ylabel("RSS of the whole run (MB)")
    b.plot(steps, store)
    b.set_xlabel("step")
    b.set_ylabel("replay store (trajectories)")
    for ax in (a, b):
        if full_at is not None:
            ax.axvline(full_at, color="grey", ls="--", lw=1)
    fig.suptitle("long-run stability (dashed: replay store full)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
