"""Soak: a free-running decoupled run (2 searchers) driven to its planned updates through a seeded schedule of
faults, resumed after each one as an operator would; the trajectory ledger and the step history show what was lost.

    python benchmarks/soak.py [--updates 300] [--faults 10] [--seed 0] [--save-every 5] [--stall-timeout 60]
                              [--max-minutes 75] [--out benchmarks/results/soak.json]

The run is ``tba-ext train --config cpu_tba_decoupled`` on the tiny model (k = 2 local updates a step,
``trainer.resume_mode=auto``, a checkpoint every ``--save-every`` steps). Faults, at steps drawn with ``--seed``
(each kind at least once when there are 4 or more):
- ``kill_searcher``: SIGKILL one searcher process; Ray restarts it and the run goes on;
- ``kill_trainer``: SIGKILL the trainer (verl's driver); the run is launched again and resumes from the latest
  checkpoint;
- ``stall_searcher``: SIGSTOP one searcher; the launcher's watchdog (``--stall-timeout``) ends the run if no step
  finishes, and it is resumed (a run that goes on without the frozen searcher is let go on; the searcher is
  SIGCONTed after the watchdog's time);
- ``corrupt_store``: SIGKILL the trainer, then cut the latest checkpoint's replay store file in half; the resume
  must refuse it naming the file, and the operator's remedy follows: that checkpoint moved aside, the run resumed
  from the one before.
Figures (JSON + PNG): updates completed; faults survived; the ledger's books at the end (trajectories read,
stored, evicted by rule, dropped by reason, trained on) and whether they balanced at every step; trajectories lost
to crashes (read after the checkpoint a crash resumed from: bounded by ``--save-every`` steps' reads); duplicate
or skipped optimizer steps in the run's effective history; trainer memory (RSS of the session's processes) and the
store's size over the run; wall time lost per fault.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

import psutil
from common import prepare_run, process_kind, provenance

from tba_ext.core import hold
from tba_ext.core.replay import REPLAY_FILE, saved_ledger
from tba_ext.core.steps import step_folder
from tba_ext.tools.processes import children, cmdline, session_pids
from tba_ext.tools.report import read_json, read_metrics, write_json

KINDS = ("kill_searcher", "kill_trainer", "stall_searcher", "corrupt_store")
LOCAL_UPDATES = 2  # cpu_tba_decoupled's k: optimizer updates per global step


def fault_schedule(n_faults: int, steps: int, seed: int) -> list[tuple[int, str]]:
    """``n_faults`` (step, kind) pairs, at distinct steps in (2, steps - 2], every kind once before any repeats."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds = (kinds * (n_faults // len(KINDS) + 1))[:n_faults]
    rng.shuffle(kinds)
    at = sorted(rng.sample(range(3, max(steps - 1, 4)), n_faults))
    return list(zip(at, kinds))


def parse(argv=None):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--schedule", default=None, help="the faults as STEP:KIND,... instead of drawn ones (e.g. 3:kill_searcher)"
    )
    parser.add_argument("--save-every", type=int, default=5, help="global steps between checkpoints")
    parser.add_argument("--stall-timeout", type=int, default=60)
    parser.add_argument("--max-minutes", type=float, default=75.0)
    parser.add_argument("--run-dir", default="benchmarks/results/soak_run")
    parser.add_argument("--out", default="benchmarks/results/soak.json")
    parser.add_argument("--resummarise", action="store_true", help="read --out's run (in --run-dir) again, no run")
    parser.add_argument("--replot", action="store_true", help="draw --out's plot again from its JSON, no run")
    return parser.parse_args(argv)


class Segment:
    """One launch of the run, from start (or resume) to its exit."""

    def __init__(self, index: int, run: str, ckpt: str, steps: int, args, pending: list):
        self.index, self.metrics = index, f"{run}/segment_{index}.jsonl"
        # the trainer holds at the start of the step after each pending fault's, until the fault is injected
        self.holds = f"{run}/holds_{index}"
        os.makedirs(self.holds, exist_ok=True)
        points = ",".join(f"step_begin@{at + 1}" for at, _ in pending)
        hold_env = {hold.HOLD_AT_ENV: points, hold.HOLD_DIR_ENV: self.holds}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tba_ext.cli",
                "train",
                "--config",
                "cpu_tba_decoupled",
                "--log",
                f"{run}/segment_{index}.log",
                "--metrics",
                self.metrics,
                "--stall-timeout",
                str(args.stall_timeout),
                f"run_dir={run}",
                f"trainer.total_training_steps={steps}",
                f"trainer.save_freq={args.save_every}",
                f"trainer.default_local_dir={ckpt}",
                "trainer.resume_mode=auto",
                "actor_rollout_ref.rollout.n_gpus_per_node=2",
                "ray_kwargs.ray_init.num_gpus=3",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, **hold_env),
        )
        self.started = time.time()
        self.seen: dict[int, float] = {}  # step -> wall time it was first seen logged

    def steps(self) -> list[dict]:
        records = read_metrics(self.metrics) if os.path.exists(self.metrics) else []
        now = time.time()
        for r in records:
            self.seen.setdefault(r["step"], now)
        return records

    def held_after(self, at: int) -> bool:
        """Whether the trainer is held at the start of step ``at + 1`` (step ``at`` done)."""
        return hold.reached(self.holds, "step_begin", at + 1)

    def release(self, at: int) -> None:
        hold.release(self.holds, "step_begin", at + 1)

    def driver(self) -> int | None:
        kids = [p for p in children(self.proc.pid) if "verl.trainer.main_ppo" in cmdline(p)]
        return kids[0] if kids else None

    def searchers(self) -> list[int]:
        sid = self.driver()
        return [p for p in session_pids(sid) if "HFCPUServer" in cmdline(p)] if sid else []

    def memory(self) -> dict:
        """RSS (MB) of the session's processes: all of them, and the largest trainer-side worker."""
        sid = self.driver()
        total, trainer = 0.0, 0.0
        for pid in session_pids(sid) if sid else []:
            try:
                proc = psutil.Process(pid)
                rss = proc.memory_info().rss / 2**20
                kind = process_kind(proc)
            except psutil.Error:
                continue
            total += rss
            if "HFCPUServer" not in kind and kind not in ("raylet", "gcs_server", "main_ppo", "tba_ext.cli"):
                trainer = max(trainer, rss)
        return {"session_rss_mb": total, "largest_worker_rss_mb": trainer}


def last_checkpoint(ckpt: str) -> int:
    tracker = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
    return int(open(tracker).read()) if os.path.exists(tracker) else 0


def ledger_ids_at(ckpt: str, step: int) -> int:
    """Trajectories the ledger had read by the checkpoint of ``step`` (0 before any)."""
    path = os.path.join(step_folder(ckpt, step), REPLAY_FILE)
    if not step or not os.path.exists(path):
        return 0
    return len(saved_ledger(path)[0])


def run_soak(args) -> dict:
    steps = args.updates // LOCAL_UPDATES
    run = prepare_run(args.run_dir, 256)
    ckpt = f"{run}/ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    schedule = (
        [(int(at), kind) for at, kind in (item.split(":") for item in args.schedule.split(","))]
        if args.schedule
        else fault_schedule(args.faults, steps, args.seed)
    )
    unknown = {kind for _, kind in schedule} - set(KINDS)
    if unknown:
        raise ValueError(f"--schedule: unknown fault kinds {sorted(unknown)}; choose from {list(KINDS)}")
    print(f"soak: {steps} steps ({args.updates} updates), faults {schedule}", flush=True)
    pending, faults, segments, timeline = list(schedule), [], [], []
    deadline = time.time() + 60 * args.max_minutes
    start = time.time()
    while time.time() < deadline:
        segment = Segment(len(segments), run, ckpt, steps, args, pending)
        resumed_from = last_checkpoint(ckpt)
        segments.append({"index": segment.index, "resumed_from_step": resumed_from, "metrics": segment.metrics})
        print(f"soak: segment {segment.index} from step {resumed_from}", flush=True)
        stopped = watch(segment, pending, faults, timeline, ckpt, args, deadline, start)
        out = segment.proc.stdout.read() if segment.proc.stdout else ""
        segments[-1].update({"exit_code": segment.proc.returncode, "steps_seen": segment.seen, "tail": out[-1500:]})
        if stopped == "done":
            break
        if stopped == "corrupt_store":
            corrupt_and_fall_back(run, ckpt, segments, args, faults)
        elif stopped == "failed":
            raise RuntimeError(f"segment {segment.index} failed with no fault injected:\n{out[-3000:]}")
    result = summarise(args, steps, schedule, faults, segments, timeline, ckpt, time.time() - start)
    return {**result, "started_at": start}


def watch(segment: Segment, pending: list, faults: list, timeline: list, ckpt: str, args, deadline, start) -> str:
    """Poll the segment until it exits; inject each fault while the trainer is held after its step. Returns "done"
    (planned end), "corrupt_store" (trainer killed for a store corruption) or "exited" (killed, stalled, or
    failed)."""
    stalled: tuple[int, float] | None = None
    injected = False
    next_memory = 0.0
    while segment.proc.poll() is None and time.time() < deadline:
        records = segment.steps()
        step = records[-1]["step"] if records else 0
        if time.time() >= next_memory:
            timeline.append({"t": time.time() - start, "segment": segment.index, "step": step, **segment.memory()})
            next_memory = time.time() + 5
        if stalled and time.time() > stalled[1]:  # the run went on without it: let the searcher go
            resume_process(stalled[0])
            stalled = None
        if pending and segment.held_after(pending[0][0]):  # the fault lands while the trainer is held
            at, kind = pending.pop(0)
            fault = {"step": at, "kind": kind, "time": time.time(), "segment": segment.index, "at_step": step}
            faults.append(fault)
            injected = True
            print(f"soak: fault {kind} after step {at}", flush=True)
            if kind in ("kill_searcher", "stall_searcher"):
                searchers = segment.searchers()
                if not searchers:
                    fault["skipped"] = "no searcher process found"
                else:
                    os.kill(searchers[0], signal.SIGKILL if kind == "kill_searcher" else signal.SIGSTOP)
                    if kind == "stall_searcher":
                        stalled = (searchers[0], time.time() + 1.5 * args.stall_timeout)
                segment.release(at)
                continue
            driver = segment.driver()
            if driver is None:
                raise RuntimeError(f"segment {segment.index}: held after step {at} but its verl driver is gone")
            os.kill(driver, signal.SIGKILL)
            segment.proc.wait(timeout=300)
            return kind if kind == "corrupt_store" else "exited"
        time.sleep(0.5)
    if segment.proc.poll() is None:  # out of time: stop the run, keep what it did
        segment.proc.send_signal(signal.SIGINT)
        segment.proc.wait(timeout=300)
        return "done"
    segment.steps()
    if stalled:
        resume_process(stalled[0])
    if segment.proc.returncode == 0:
        return "done"
    return "exited" if injected else "failed"


def resume_process(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # the watchdog stopped the run, and it with it
        pass


def corrupt_and_fall_back(run: str, ckpt: str, segments: list, args, faults: list) -> None:
    """Cut the latest checkpoint's replay store in half; show that a resume refuses it naming the file (one launch
    that must fail), then move that checkpoint aside and point verl's tracker at the one before."""
    step = last_checkpoint(ckpt)
    fault = faults[-1]
    path = os.path.join(step_folder(ckpt, step), REPLAY_FILE)
    if not step or not os.path.exists(path):
        fault["skipped"] = "no checkpoint with a replay store yet"
        return
    fault["corrupted_checkpoint_step"] = step
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    probe = Segment(len(segments), run, ckpt, args.updates // LOCAL_UPDATES, args, pending=[])
    out, _ = probe.proc.communicate(timeout=900)
    fault["refused"] = probe.proc.returncode != 0 and path in out and "is corrupt" in out
    segments.append(
        {"index": probe.index, "resumed_from_step": step, "probe": True, "exit_code": probe.proc.returncode}
    )
    previous = [s for s in range(step - args.save_every, 0, -args.save_every) if os.path.isdir(step_folder(ckpt, s))]
    os.rename(step_folder(ckpt, step), step_folder(ckpt, step) + ".damaged")
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(previous[0] if previous else 0))
    fault["fell_back_to_step"] = previous[0] if previous else 0


def effective_history(segments: list) -> tuple[list[int], dict]:
    """The optimizer steps that make the final model, in order: each segment's steps up to the step the next
    segment resumed from (a step whose metrics line died with the crash counts when that resume's checkpoint,
    written after it, proves it ran); and the steps redone after a crash."""
    runs = [s for s in segments if not s.get("probe")]
    history, redone = [], {}
    for seg, following in zip(runs, runs[1:] + [None]):
        logged = sorted(int(k) for k in seg.get("steps_seen", {}))
        keep = following["resumed_from_step"] if following else None
        kept = [s for s in logged if keep is None or s <= keep]
        last = kept[-1] if kept else seg["resumed_from_step"]
        proven = list(range(last + 1, keep + 1)) if keep is not None and seg["resumed_from_step"] <= last else []
        history += kept + proven
        if keep is not None:
            redone[seg["index"]] = [s for s in logged if s > keep]
    return history, redone


def final_books(ckpt: str) -> dict:
    """The ledger's counts in the last checkpoint's replay store, exact (the step metrics average a decoupled
    step's k samples), and whether they balance against it."""
    from tba_ext.core.ledger import unbalanced

    step = last_checkpoint(ckpt)
    ledger, store_size = saved_ledger(os.path.join(step_folder(ckpt, step), REPLAY_FILE))
    counts = ledger.counts()
    return {"checkpoint_step": step, **counts, "unbalanced": unbalanced(counts, store_size)}


def summarise(args, steps, schedule, faults, segments, timeline, ckpt, wall) -> dict:
    runs = [s for s in segments if not s.get("probe")]
    seen = sorted((t, step) for s in runs for step, t in s["steps_seen"].items())
    for fault in faults:  # wall time lost: from the fault until a step past the one the run had reached
        after = [t for t, step in seen if t > fault["time"] and step > fault["at_step"]]
        fault["wall_s_to_next_new_step"] = after[0] - fault["time"] if after else None
    step_times = []
    for s in runs:
        times = sorted(s["steps_seen"].values())
        step_times += [b - a for a, b in zip(times, times[1:])]
    return {
        "how": "benchmarks/soak.py: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "provenance": provenance(),
        "planned_updates": args.updates,
        "faults_planned": [{"step": s, "kind": k} for s, k in schedule],
        "faults": faults,
        **outcome(segments, faults, steps, ckpt, args.save_every),
        "memory": memory_summary(timeline),
        "step_s_median": statistics.median(step_times) if step_times else None,
        "wall_s": wall,
        "segments": [{k: v for k, v in s.items() if k != "steps_seen"} for s in segments],
        "timeline": timeline,
    }


def outcome(segments, faults, steps: int, ckpt: str, save_every: int) -> dict:
    """What the run's files say about it: the step history, the ledger's books, the trajectories lost."""
    history, redone = effective_history(segments)
    runs = [s for s in segments if not s.get("probe")]
    logged = {s["index"]: read_metrics(s["metrics"]) if os.path.exists(s["metrics"]) else [] for s in runs}
    records = [r for s in runs for r in logged[s["index"]]]
    lost = []  # per crash: read by the crashed segment, past the checkpoint the next one resumed from and its journal
    # (from its last step's ledger/ids, the mean of the step's k samples: short of the truth by up to half a step's
    # reads)
    for seg, following in zip(runs, runs[1:]):
        read_by_crash = max((r["data"].get("ledger/ids", 0) for r in logged[seg["index"]]), default=0)
        replayed = next(
            (
                r["data"]["replay/journal_replayed"]
                for r in logged[following["index"]]
                if "replay/journal_replayed" in r["data"]
            ),
            0,
        )
        lost.append(max(read_by_crash - ledger_ids_at(ckpt, following["resumed_from_step"]) - replayed, 0))
    expected = set(range(1, steps + 1))
    return {
        "updates_completed": len(set(history) & expected) * LOCAL_UPDATES,
        "faults_survived": sum(1 for f in faults if "skipped" not in f) if set(history) == expected else 0,
        # steps the final model went through twice, or never, against 1..planned
        "duplicate_steps": len(history) - len(set(history)),
        "skipped_steps": len(expected - set(history)),
        "history_in_order": history == sorted(set(history)),
        "steps_redone_after_crashes": sum(len(v) for v in redone.values()),
        "ledger_final": final_books(ckpt),
        "ledger_balanced_every_step": all(r["data"].get("ledger/unbalanced", 1.0) == 0.0 for r in records),
        "trajectories_lost_to_crashes": lost,
        "loss_bound": "what the searchers had finished but the trainer had not yet read; where the latest checkpoint "
        f"was refused and the one before taken, also what was read after the refused one (at most {save_every} "
        "steps' reads)",
        "store_trajectories_max": max((r["data"].get("replay/store_trajectories", 0) for r in records), default=0),
        "store_mb_max": max((r["data"].get("replay/store_mb", 0.0) for r in records), default=0.0),
    }


def resummarise(path: str, run_dir: str, save_every: int) -> dict:
    """The run's outcome read again from its files (after a change to how it is read); timings are kept."""
    import json as _json

    result = _json.load(open(path))
    segments = [
        dict(s, steps_seen={r["step"]: 0.0 for r in read_metrics(s["metrics"])} if not s.get("probe") else {})
        for s in result["segments"]
    ]
    steps = result["planned_updates"] // LOCAL_UPDATES
    result.update(outcome(segments, result["faults"], steps, os.path.join(run_dir, "ckpt"), save_every))
    return result


def memory_summary(timeline: list) -> dict:
    """Median session and largest-worker RSS over the first and the last third of the samples (growth shows as a
    rising last third)."""
    samples = [t for t in timeline if t["session_rss_mb"] > 0]
    if len(samples) < 3:
        return {}
    third = len(samples) // 3
    out = {}
    for key in ("session_rss_mb", "largest_worker_rss_mb"):
        out[key] = {
            "first_third_median": statistics.median(t[key] for t in samples[:third]),
            "last_third_median": statistics.median(t[key] for t in samples[-third:]),
            "max": max(t[key] for t in samples),
        }
    return out


FAULT_LABELS = {
    "kill_searcher": "searcher killed (kill -9)",
    "kill_trainer": "trainer killed (kill -9)",
    "stall_searcher": "searcher stalled past the watchdog",
    "corrupt_store": "replay store cut before a resume",
}


def plot(result: dict, path: str) -> None:
    """Training progress and memory against wall-clock, one line per run segment, faults marked by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    timeline, start = result["timeline"], result["started_at"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    # the samples of a segment until the next restart; a restarting run logs step 0 until it resumes: not drawn
    segment, segments = [], [[]]
    for x in timeline:
        if segment and x["step"] < segment[-1]["step"]:
            segments.append([])
        segment = segments[-1]
        if x["step"] > 0:
            segment.append(x)
    for points in segments:
        top.plot([x["t"] / 60 for x in points], [x["step"] for x in points], color="tab:blue", linewidth=1.2)
    colours = dict(zip(KINDS, ("tab:orange", "tab:red", "tab:purple", "tab:brown")))
    for fault in result["faults"]:
        for ax in (top, bottom):
            ax.axvline((fault["time"] - start) / 60, color=colours[fault["kind"]], alpha=0.7, linewidth=1)
    kinds = [k for k in KINDS if any(f["kind"] == k for f in result["faults"])]
    top.legend([Line2D([], [], color=colours[k]) for k in kinds], [FAULT_LABELS.get(k, k) for k in kinds], fontsize=7)
    top.set_ylabel(f"global step reached ({LOCAL_UPDATES} updates each)")
    t = [x["t"] / 60 for x in timeline]
    bottom.plot(t, [x["session_rss_mb"] for x in timeline], label="all of the run's processes (RSS)")
    bottom.plot(t, [x["largest_worker_rss_mb"] for x in timeline], label="largest trainer-side worker (RSS)")
    bottom.set_ylabel("memory (MB)")
    bottom.set_xlabel("wall-clock since start (min)")
    bottom.legend(fontsize=7)
    top.set_title(
        f"{result['updates_completed']} of {result['planned_updates']} updates; {result['faults_survived']} of "
        f"{len(result['faults'])} faults (vertical lines) survived, each run segment resuming where one was saved",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse(argv)
    if args.replot:
        result = read_json(args.out)
        plot(result, args.out.replace(".json", ".png"))
        return result
    if args.resummarise:
        result = resummarise(args.out, os.path.abspath(args.run_dir), args.save_every)
    else:
        result = run_soak(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json(result, args.out)
    plot(result, args.out.replace(".json", ".png"))
    print(json.dumps({k: v for k, v in result.items() if k not in ("timeline", "segments")}, indent=1))
    return result


if __name__ == "__main__":
    main()
