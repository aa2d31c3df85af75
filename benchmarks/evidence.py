"""Every figure of the compare page from one command: the seed-paired grid on both CPU tasks and the staleness stress.

    python benchmarks/evidence.py [--only primary dose arms_s8 countdown_s8 arith20 countdown stress stress_long]
                                  [--jobs 2]
                                  [--seeds 0 1 2 3 4] [--methods ...] [--staleness ...] [--resume]

Each study is ``tba-ext compare`` on one task. Its seeds run as separate processes, ``--jobs`` at a time, each in
its own run folder under benchmarks/results/evidence_run/ (ignored by git). They are merged into
benchmarks/results/compare_<study>.json, with report and plots in benchmarks/results/compare_<study>/, and
docs/generate.py renders the compare page from those JSONs. ``--seeds``, ``--methods`` and ``--staleness``
narrow a study and add its cells to the study's JSON (a cell already there is refused before any run); each JSON's
``how`` records the command that made it, and ``cost`` its wall-clock seconds and the CPU seconds of the processes
it ran (``getrusage`` of reaped children: a lower bound). ``--resume`` merges the seeds an interrupted run of the same
command finished (their part JSONs in evidence_run/) and runs only the others; ``cost`` then counts those.

CPU cost on the project's 2-core machine: an arith20 run (60 updates of 32 prompts x 8) is ~8 min alone and ~12 min
two at a time, so one staleness level of a grid (3 methods x 5 seeds) took 2.1 hours with ``--jobs 2`` (arith20
at s = 0; countdown's 40 updates take about two thirds of that). Stress runs (60 updates), two at a time: at s = 32,
after 32 batches of warm-up generation, 17-18 min for each TBA′ arm and 38 min for Dr. GRPO (verl's separate
old-log-prob pass, and validation in its colocate_async mode that averaged 14 s per update against TBA′'s 0.4 s),
so three seeds took about two hours; mixed, after a 12.75-batch initial buffer, 12-15 min. stress_long's two
120-update runs took 28 min side by side as two processes; evidence.py runs a seed's methods one after the other.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from common import provenance

from tba_ext.cli import staleness_arg
from tba_ext.tools.compare import merge, run_cell
from tba_ext.tools.report import read_json, write_json

RESULTS = "benchmarks/results"
# study -> its compare arguments. The fair experiment (every arm uncapped at the same s, the corrected Dr. GRPO
# beside the uncorrected one): its primary comparison, named before it ran (docs/compare.md), is TBA′ minus Dr.
# GRPO token-IS at s = 8 on arith20, held-out greedy gain, 8 seeds; the dose-response over s, every arm at s = 8 and
# countdown at s = 8 are secondary. The grids: TB, TBA′ and Dr. GRPO on-policy and at s = 10 on both tasks. The
# stress: at s = 32 TBA′ with its KL coefficient against TBA′ with beta = 0 and Dr. GRPO, longer, validated often
STUDIES = {
    "primary": {  # 40 updates, not the grids' 60: 16 runs fit one working session on the 2-core machine
        "task": "arith20",
        "methods": ["tb_pg", "drgrpo_tis"],
        "staleness": [8],
        "steps": 40,
        "eval_every": 20,
        "seeds": [0, 1, 2, 3, 4, 5, 6, 7],
    },
    "dose": {
        "task": "arith20",
        "methods": ["tb_pg", "drgrpo_tis", "drgrpo"],
        "staleness": [0, 2, 8, 32],
        "steps": 60,
        "eval_every": 20,
    },
    "arms_s8": {  # the objective apart from the store (TBA′ on Dr. GRPO's batches), the paper's TB, and each of
        # verl's corrections
        "task": "arith20",
        "methods": ["tb", "tb_pg", "tb_pg_fifo", "drgrpo", "drgrpo_tis", "drgrpo_sis", "drgrpo_bypass"],
        "staleness": [8],
        "steps": 60,
        "eval_every": 20,
    },
    "countdown_s8": {
        "task": "countdown",
        "methods": ["tb_pg", "drgrpo_tis"],
        "staleness": [8],
        "steps": 40,
        "eval_every": 10,
    },
    "arith20": {
        "task": "arith20",
        "methods": ["tb", "tb_pg", "drgrpo"],
        "staleness": [0, 10],
        "steps": 60,
        "eval_every": 20,
    },
    "countdown": {  # 40 updates: its warm start's TBA′ pilot gained most of its +0.11 by update 30
        "task": "countdown",
        "methods": ["tb", "tb_pg", "drgrpo"],
        "staleness": [0, 10],
        "steps": 40,
        "eval_every": 10,
    },
    "stress": {  # s = 32, and batches mixing staleness 1, 4, 10 and 32 (recipe.STALENESS_MIX)
        "task": "arith20",
        "methods": ["tb_pg", "tb_pg_nokl", "drgrpo"],
        "staleness": [32, "mix"],
        "steps": 60,
        "eval_every": 10,
    },
    "stress_long": {  # TBA′ with and without KL at s = 32 for 120 updates, past the ~100 after which tba-prime's
        # report saw the run without KL collapse; one seed (28 min a run, two side by side)
        "task": "arith20",
        "methods": ["tb_pg", "tb_pg_nokl"],
        "staleness": [32],
        "steps": 120,
        "eval_every": 20,
        "seeds": [0],
    },
}
SEEDS = [0, 1, 2, 3, 4]  # a study's seeds unless it names its own


def seed_command(spec: dict, seed: int, run_dir: str, part: str) -> list[str]:
    return [
        sys.executable,
        "benchmarks/compare_grid.py",
        f"--task={spec['task']}",
        "--seeds",
        str(seed),
        "--staleness",
        *map(str, spec["staleness"]),
        "--methods",
        *spec["methods"],
        f"--steps={spec['steps']}",
        f"--eval-every={spec['eval_every']}",
        f"--run-dir={run_dir}",
        f"--out={part}",
    ]


def run_study(
    study: str, tag: str, spec: dict, seeds: list[int], jobs: int, kept: str | None = None, resume: bool = False
) -> dict:
    """The study's seeds as parallel compare processes (``jobs`` at a time), merged into its JSON and plots, with
    ``kept`` (the study's JSON so far, when a narrowed command adds cells to it) as one more part. Each seed's
    files are evidence_run/<tag>_seed<N>*. ``resume``: a seed whose part an earlier, interrupted run of the same
    command finished is merged, not run again."""
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    parts, pending, running = [], list(seeds), []
    for seed in seeds if resume else []:
        part = f"{RESULTS}/evidence_run/{tag}_seed{seed}.json"
        if os.path.exists(part):
            parts.append(part)
            pending.remove(seed)
            print(f"[{study}] seed {seed}: {part} from an earlier run (--resume)", flush=True)
    start = time.time()
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            run_dir, part = f"{RESULTS}/evidence_run/{tag}_seed{seed}", f"{RESULTS}/evidence_run/{tag}_seed{seed}.json"
            log = open(f"{run_dir}.out", "w")
            print(f"[{study}] seed {seed}: log {log.name}", flush=True)
            running.append((subprocess.Popen(seed_command(spec, seed, run_dir, part), stdout=log, stderr=log), part))
        time.sleep(5)
        for proc, part in list(running):
            if proc.poll() is not None:
                running.remove((proc, part))
                if proc.returncode:
                    raise SystemExit(f"[{study}] a compare process failed ({proc.returncode}); see {part[:-5]}.out")
                parts.append(part)
                print(f"[{study}] {len(parts)}/{len(seeds)} seeds done ({time.time() - start:.0f}s)", flush=True)
    parts = sorted(parts) + ([kept] if kept else [])
    payload = merge(parts, f"{RESULTS}/compare_{study}", f"{RESULTS}/compare_{study}.json")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative over this process: this study's share
    cpu = usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime
    payload["cost"] = {"wall_s": time.time() - start, "cpu_s_reaped": cpu, "jobs": jobs}
    return payload


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", choices=list(STUDIES), default=list(STUDIES))
    parser.add_argument("--jobs", type=int, default=2, help="compare processes at a time (one core each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="narrow every study to these seeds")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="merge the seeds an interrupted run of this command finished; run the rest",
    )
    parser.add_argument("--methods", nargs="+", default=None, help="narrow every study to these methods")
    parser.add_argument(
        "--staleness", type=staleness_arg, nargs="+", default=None, help="narrow every study to these levels"
    )
    args = parser.parse_args()
    os.makedirs(f"{RESULTS}/evidence_run", exist_ok=True)  # a fresh clone has no such folder; parts and kept go there
    for study in args.only:
        spec = dict(STUDIES[study])
        if args.methods:
            spec["methods"] = [m for m in spec["methods"] if m in args.methods]
        if args.staleness:
            spec["staleness"] = [s for s in spec["staleness"] if s in args.staleness]
        if not spec["staleness"] or not spec["methods"]:
            continue  # narrowed to nothing
        # a narrowed command adds its cells to the study's results instead of replacing them (merge refuses a
        # cell run twice); the full command starts the study again
        study_seeds = STUDIES[study].get("seeds", SEEDS)
        seeds = args.seeds or study_seeds
        narrowed = spec != STUDIES[study] or seeds != study_seeds
        # a narrowed command's files are named by its cells, so they sit beside the study's earlier ones
        tag = f"{study}_{'-'.join(spec['methods'])}_s{'-'.join(map(str, spec['staleness']))}" if narrowed else study
        path = f"{RESULTS}/compare_{study}.json"
        kept = None
        if narrowed and os.path.exists(path):
            done = {run_cell(r) for r in read_json(path)["runs"]}
            planned = {(m, str(s), seed) for m in spec["methods"] for s in spec["staleness"] for seed in seeds}
            if done & planned:
                raise SystemExit(f"[{study}] {path} already holds {sorted(done & planned)}: narrow to the others")
            kept = f"{RESULTS}/evidence_run/{study}_kept.json"
            shutil.copyfile(path, kept)
        payload = run_study(study, tag, spec, seeds, args.jobs, kept, args.resume)
        payload["how"] = "benchmarks/evidence.py " + " ".join(sys.argv[1:])
        if kept:
            payload["how"] += f", merged with the study's earlier results ({read_json(kept).get('how')})"
        payload["provenance"] = provenance()
        write_json(payload, f"{RESULTS}/compare_{study}.json")
        print(json.dumps(read_json(f"{RESULTS}/compare_{study}.json")["cost"]), flush=True)
    subprocess.run([sys.executable, "docs/generate.py"], check=True)


if __name__ == "__main__":
    main()
