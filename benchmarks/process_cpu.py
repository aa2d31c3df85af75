"""Where the CPU goes in one verl run: CPU seconds per process kind (Ray actor class, raylet, GCS, driver...).

    python benchmarks/process_cpu.py [--config cpu_tba_decoupled] [--steps 12] [overrides ...]

Runs ``tba-ext train`` on the benchmarks' prepared arith folder (small model), samples every process of the
run's session once a second (psutil: user + system CPU time, kept per pid until it exits) and writes CPU seconds
per kind, their share of the run's wall time x cores, and the verl step timings. Kinds come from Ray's process
titles (``ray::HFCPUServer...`` -> HFCPUServer) or the executable. JSON + table.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import psutil
from common import prepare_run, process_kind, same_process_kind

from tba_ext.tools import report
from tba_ext.tools.processes import children, cmdline, session_pids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="cpu_tba_decoupled")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--run-dir", default="benchmarks/results/process_cpu_run")
    parser.add_argument("--out", default="benchmarks/results/process_cpu.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    run = prepare_run(args.run_dir, train_size=2000, size="small")
    metrics = os.path.join(run, f"{args.config}.jsonl")
    cmd = [
        sys.executable,
        "-m",
        "tba_ext.cli",
        "train",
        "--config",
        args.config,
        "--log",
        metrics + ".log",
        "--metrics",
        metrics,
        f"run_dir={run}",
        f"trainer.total_training_steps={args.steps}",
        *args.overrides,
    ]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    cpu: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds at its last sample)
    while proc.poll() is None:
        pids = [proc.pid] + [p for p in children(proc.pid) if "main_ppo" in cmdline(p)]
        sid = pids[-1] if len(pids) > 1 else None
        for pid in set(pids) | set(session_pids(sid) if sid else []):
            try:
                p = psutil.Process(pid)
                t = p.cpu_times()
                name = same_process_kind(process_kind(p), cpu.get(pid, (None,))[0])
                cpu[pid] = (name, t.user + t.system)
            except psutil.Error:
                continue
        time.sleep(1.0)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (code {proc.returncode}); see {metrics}.log")
    per_kind: dict[str, float] = {}
    for name, seconds in cpu.values():
        per_kind[name] = per_kind.get(name, 0.0) + seconds
    cores = psutil.cpu_count()
    records = report.read_metrics(metrics)
    timing = {}
    for rec in records[1:]:
        for key, value in rec["data"].items():
            if key.startswith("timing_s/"):
                timing[key[9:]] = timing.get(key[9:], 0.0) + value
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "steps": args.steps,
        "wall_s": wall,
        "cores": cores,
        "cpu_s": dict(sorted(per_kind.items(), key=lambda kv: -kv[1])),
        "cpu_share_of_wall_x_cores": {k: v / (wall * cores) for k, v in per_kind.items()},
        "verl_timing_s_after_step_1": timing,
    }
    report.ensure_dir(os.path.dirname(os.path.abspath(args.out)))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{args.config} {' '.join(args.overrides)}: wall {wall:.0f} s x {cores} cores")
    for name, seconds in result["cpu_s"].items():
        print(f"  {name:<28} {seconds:8.1f} CPU s  {seconds / (wall * cores):6.1%}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
