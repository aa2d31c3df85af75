"""Sync vs decoupled TBA on the same CPUs, for the same number of trained samples, 1 and 2 searchers.

    python benchmarks/async_speedup.py [--regime short|generation_bound] [--steps 12] [--repeats 3]
                                       [--searchers 1 2] [--paced 1] [--prompts 8] [--sync-every 2]

Two regimes, each written under ``regimes.<name>`` of one JSON (a run of one regime keeps the other's entry):
- short: the arith task, answers of a few tokens (max_response_length 8): the trainer's share of the wall is large;
- generation_bound: the arith_worked task, a worked answer of about 50 tokens (max_response_length 64) that ends
  in the number, so generation is most of the sync run's wall: the regime TBA exists for. Its responses run to the
  64 tokens (verl's ``rollout.ignore_eos``, as throughput benchmarks of vLLM do), so every configuration generates
  and trains the same tokens per sample: without it the policies of this short run drift toward the limit at
  different rates (decoupled 63 tokens on average, sync 54), and the comparison measured the drift.

Every run trains the `small` model on the same data with the tb loss and the TBA replay sampler, k x ``--prompts``
prompts per global step in k optimizer updates (k = ``--sync-every``, the decoupled runs' parameter_sync_step), for
``--steps`` global steps; the first step (warm-up, initial weight sync) is not measured, so 12 steps of k = 2
measure 22 updates. All train with the fused update (one actor call per update, no old-log-prob pass) and take the
reference log-probs from the rollout, so the trainer's work per update is the same in every configuration (with
k = 1 the decoupled runs sync weights after every update). The configurations:
- sync: `cpu_tba` with trainer_mode=tba_sync (generation, then training, then weight sync, in turn), the rollout
  scoring each sample with its copy of the initial model as the decoupled runs' searchers do (the same work in
  both: no reference pass on the trainer);
- decoupled N: `cpu_tba_decoupled` with N searcher replicas running free (a queue of four updates' prompts,
  topped up before every update; the trainer trains on the store without waiting for fresh groups);
- decoupled N paced (``--paced``): the same, with ``tba.searcher_prompts_per_consumed=1.0``: the searchers stay
  at most the queue ahead of what the trainer consumes, instead of generating as fast as they can on the cores
  the trainer needs.
Each configuration runs ``--repeats`` times; figures are medians with the min-max spread. Reported:
speedup_vs_sync (median sync wall / median decoupled wall, wall = summed verl step time), trainer_idle_ratio
(time waiting for data / step time), searcher_idle_ratio, weight_sync_share (weight sync / step time) and where
the sync went (verl's stages vs the transfer), ideal_overlap ((gen + train) / max(gen, train) from the sync runs'
own timings), cores_busy (machine-wide busy cores over the measured steps: run on an idle machine),
cpu_s_per_update, cpu_work_vs_sync (decoupled CPU s per update / sync's) and cpu_bound_ceiling (cores / sync's busy
cores: what any overlap of sync's CPU work could reach), fraction_of_ideal_overlap (speedup_vs_sync / ideal_overlap),
generation_share (sync's generation seconds / its wall) and response_length_mean. JSON + table + PNG timeline of
one run per configuration (``async_speedup_<regime>.png``).
"""

import json
import os
import statistics
import threading
import time

import psutil
from common import (
    DAEMON_KINDS,
    GENERIC_KINDS,
    SEARCHER_REFERENCE,
    parse_args,
    prepare_run,
    process_kind,
    provenance,
    same_process_kind,
)

from tba_ext.adapters.decoupled import TBATrainerSeparateAsync
from tba_ext.tools import report
from tba_ext.tools.launch import run_verl
from tba_ext.tools.processes import children, cmdline, session_pids

SYNC_PHASES = TBATrainerSeparateAsync.SYNC_PHASES  # verl's weight-sync stages the trainer times
# regime -> (task, max_response_length, rollout.ignore_eos)
REGIMES = {"short": ("arith", 8, False), "generation_bound": ("arith_worked", 64, True)}


def extra_args(parser):
    parser.add_argument("--replot", action="store_true", help="draw --out's CPU charts again from its JSON, no run")
    parser.add_argument("--regime", choices=sorted(REGIMES), default="short")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--searchers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--paced", type=int, nargs="*", default=[1], help="searcher counts also run paced")
    parser.add_argument("--size", default="small")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per optimizer update")
    parser.add_argument(
        "--sync-every",
        type=int,
        default=2,
        help="k: optimizer updates per global step (sync) and per weight sync (decoupled)",
    )


def configurations(searchers, paced, prompts, sync_every):
    yield "sync", "cpu_tba", ["trainer.v1.trainer_mode=tba_sync", SEARCHER_REFERENCE]
    for n in sorted(set(searchers) | set(paced)):
        replicas = [
            f"actor_rollout_ref.rollout.n_gpus_per_node={n}",
            f"ray_kwargs.ray_init.num_gpus={n + 1}",
            f"trainer.v1.separate_async.parameter_sync_step={sync_every}",
            f"tba.searcher_queue_prompts={4 * prompts}",
        ]  # four updates' prompts queued
        if n in searchers:
            yield f"decoupled_{n}", "cpu_tba_decoupled", replicas
        if n in paced:
            yield f"decoupled_{n}_paced", "cpu_tba_decoupled", replicas + ["tba.searcher_prompts_per_consumed=1.0"]


# Which part of a run a process is, from its kind (``common.process_kind``: the actor class in Ray's title)
ROLES = (
    ("WorkerDict", "trainer workers"),
    ("TaskRunner", "trainer loop"),
    ("HFCPUServer", "searcher model"),
    ("vLLM", "searcher model"),
    ("AgentLoopWorker", "agent loop"),
    ("RewardLoopWorker", "reward loop"),
    ("GlobalRequestLoadBalancer", "load balancer"),
    ("TransferQueue", "TransferQueue"),
    ("SimpleStorageUnit", "TransferQueue"),
)
OTHER_RAY, SYSTEM = "other Ray actors", "Ray system, driver"
ROLE_ORDER = list(dict.fromkeys([role for _, role in ROLES] + [OTHER_RAY, SYSTEM]))  # trainer side first


def process_role(kind: str) -> str:
    for prefix, role in ROLES:
        if kind.startswith(prefix):
            return role
    return SYSTEM if kind in DAEMON_KINDS else OTHER_RAY


def runqueue_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` have spent runnable but waiting for a core (/proc/<pid>/task/*/schedstat)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


class CoreUse:
    """Machine-wide busy cores over the measured steps (from the end of verl step 1 to the end of the last one):
    /proc/stat's busy CPU time sampled every ``period`` s, the step ends taken from verl's metrics file growing by
    a line. On an idle machine this is the run's own CPU use, every process of it. If sync already keeps c of the
    n cores busy, running generation beside training can at best make it n / c times faster.

    Where the CPU goes: every ``process_period`` s and at each step's mark it also reads the CPU time of every
    process of the run (the session the launcher starts verl's driver in) by role (trainer workers, searcher model,
    agent loop, ...; ``process_role``) and how long the trainer workers' threads waited in the run queue for a core:
    time the trainer's chain of calls lost to the other processes. A process that has exited keeps its last
    reading: the first mark after the last step can come after the run began to stop its searchers (a sampling
    period and a process scan on a loaded machine outlast a short run's teardown), and reading only live processes
    there dropped the searchers from the breakdown."""

    def __init__(self, metrics_path: str, period: float = 0.25, process_period: float = 1.0):
        self.path, self.period, self.process_period, self.marks = metrics_path, period, process_period, {}
        self.kinds: dict[int, str] = {}
        self.last_cpu: dict[int, float] = {}  # pid -> CPU seconds at its latest reading, kept after it exits
        self._next_process_read = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            self._sample_once()
            self._stop.wait(self.period)

    def _processes(self) -> tuple[dict[int, float], float]:
        """{pid: CPU seconds} of the run's processes (live ones read now, exited ones at their last reading), and
        the live trainer workers' run-queue wait."""
        drivers = [pid for pid in children(os.getpid()) if "main_ppo" in cmdline(pid)]
        wait = 0.0
        for pid in session_pids(drivers[0]) if drivers else []:
            try:
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                known = self.kinds.get(pid)
                # a worker's first actor class of the run's roles is final; Ray may first run a plain task in a
                # process that then hosts one of the run's actors (the agent loop), which takes that actor's role
                if known in (None, *GENERIC_KINDS) or process_role(known) == OTHER_RAY:
                    kind = process_kind(proc)
                    named = process_role(kind) not in (OTHER_RAY, SYSTEM)
                    self.kinds[pid] = kind if named else same_process_kind(kind, known)
            except psutil.Error:
                continue
            self.last_cpu[pid] = times.user + times.system
            if process_role(self.kinds[pid]) == "trainer workers":
                wait += runqueue_wait_s(pid)
        return dict(self.last_cpu), wait

    def _sample_once(self):
        t, cpu = time.monotonic(), psutil.cpu_times()
        busy = sum(cpu) - cpu.idle - getattr(cpu, "iowait", 0.0)
        try:
            with open(self.path, "rb") as f:
                lines = f.read().count(b"\n")
        except FileNotFoundError:
            lines = 0
        new_mark = lines not in self.marks  # first sample after step `lines` was written
        if new_mark or t >= self._next_process_read:
            processes = self._processes()
            self._next_process_read = t + self.process_period
            if new_mark:
                self.marks[lines] = (t, busy, *processes)

    def __enter__(self):
        if os.path.exists(self.path):  # its lines would be taken for this run's steps
            raise FileExistsError(f"{self.path} exists before the run; CoreUse needs a fresh metrics file")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample_once()

    def busy(self) -> tuple[float, float]:
        """(busy CPU seconds, wall seconds) over the measured steps."""
        (t0, b0, *_), (t1, b1, *_) = self.marks[1], self.marks[max(self.marks)]
        return b1 - b0, t1 - t0

    def by_role(self) -> tuple[dict[str, float], float]:
        """({role: CPU seconds}, trainer workers' run-queue wait in seconds) over the measured steps; a process
        started after step 1 counts from zero, one gone before the last mark counts up to its last reading."""
        (_, _, cpu0, wait0), (_, _, cpu1, wait1) = self.marks[1], self.marks[max(self.marks)]
        out: dict[str, float] = {}
        for pid, seconds in cpu1.items():
            role = process_role(self.kinds[pid])
            out[role] = out.get(role, 0.0) + seconds - cpu0.get(pid, 0.0)
        return out, wait1 - wait0


def measure(records: list[dict], updates_per_step: int) -> dict:
    d = [x["data"] for x in records[1:]]  # step 1 holds the warm-up and the initial weight sync
    step = sum(x["timing_s/step"] for x in d)
    gen = sum(x["timing_s/gen"] for x in d)
    sync = sum(x.get("tba/weight_sync_s", 0.0) for x in d)
    out = {
        "wall_s": step,
        "gen_s": gen,
        "train_s": step - gen,
        "trainer_idle_ratio": gen / step,
        "weight_sync_s_per_step": sync / len(d),
        "weight_sync_share": sync / step,
        "updates": updates_per_step * len(d),
    }
    idle = [x["tba/searcher_idle_ratio"] for x in d if "tba/searcher_idle_ratio" in x]
    if idle:
        out["searcher_idle_ratio"] = statistics.mean(idle)
    phases = {name: sum(x.get(f"tba/weight_sync/{name}_s", 0.0) for x in d) / len(d) for name in SYNC_PHASES}
    if any(phases.values()):
        out["weight_sync_phases_s_per_step"] = {
            **phases,
            "transfer": out["weight_sync_s_per_step"] - sum(phases.values()),
        }
    for key in (
        "tba/trajectories_generated_per_s",
        "tba/trajectories_consumed_per_s",
        "replay/unseen_group_frac",
        "replay/staleness_mean",
        "tba/searcher_prompts_ahead",
        "response_length/mean",
    ):
        values = [x[key] for x in d if key in x]
        if values:
            name = "response_length_mean" if key == "response_length/mean" else key.split("/")[-1]
            out[name] = statistics.mean(values)
    return out


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main():
    args = parse_args("async_speedup", steps=12, extra=extra_args)
    if args.replot:  # the CPU chart of each regime from the JSON (the timelines need a run's records)
        with open(args.out) as f:
            for regime, result in json.load(f)["regimes"].items():
                cpu_by_role(result["configurations"], args.out.replace(".json", f"_{regime}_cpu.png"))
        return
    meta = provenance()
    task, response_length, ignore_eos = REGIMES[args.regime]
    run = prepare_run(f"{args.run_dir}/{args.regime}", train_size=2000, size=args.size, task=task)
    k = args.sync_every
    common = [
        f"run_dir={run}",
        f"trainer.total_training_steps={args.steps}",
        f"data.train_batch_size={k * args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"data.max_response_length={response_length}",
        f"actor_rollout_ref.rollout.ignore_eos={str(ignore_eos).lower()}",
    ]
    runs: dict[str, list] = {}
    for repeat in range(args.repeats):
        for name, config, extra in configurations(args.searchers, args.paced, args.prompts, k):
            metrics = f"{run}/{name}_r{repeat}.jsonl"
            if os.path.exists(metrics):  # an earlier benchmark's file: CoreUse marks steps by its line count
                os.remove(metrics)
            print(f"== {name}, repeat {repeat + 1}/{args.repeats}", flush=True)
            start = time.time()
            with CoreUse(metrics) as cores:
                run_verl(config, common + extra, log_path=metrics.replace(".jsonl", ".log"), metrics_path=metrics)
            records = report.read_metrics(metrics)
            r = {"records": records, "launch_wall_s": time.time() - start, **measure(records, k)}
            cpu_s, window_s = cores.busy()
            r.update(cores_busy=cpu_s / window_s, cpu_s_per_update=cpu_s / r["updates"])
            roles, wait_s = cores.by_role()
            r["cpu_s_per_update_by_role"] = {role: sec / r["updates"] for role, sec in roles.items()}
            r["trainer_runqueue_wait_share"] = wait_s / window_s
            runs.setdefault(name, []).append(r)
            print(
                f"   wall {r['wall_s']:.1f} s, trainer idle {r['trainer_idle_ratio']:.2f}, "
                f"{r['cores_busy']:.2f} of {psutil.cpu_count()} cores busy",
                flush=True,
            )
    sync_wall = statistics.median(r["wall_s"] for r in runs["sync"])
    sync_gen = statistics.median(r["gen_s"] for r in runs["sync"])
    sync_train = statistics.median(r["train_s"] for r in runs["sync"])
    sync_cores = statistics.median(r["cores_busy"] for r in runs["sync"])
    sync_cpu = statistics.median(r["cpu_s_per_update"] for r in runs["sync"])
    result = {
        "regime": args.regime,
        "task": task,
        "max_response_length": response_length,
        "ignore_eos": ignore_eos,
        "prompts_per_update": args.prompts,
        "updates_per_sync": k,
        "steps_measured": args.steps - 1,
        "updates_measured": k * (args.steps - 1),
        "model": args.size,
        "repeats": args.repeats,
        "ideal_overlap": (sync_gen + sync_train) / max(sync_gen, sync_train),
        "cores": psutil.cpu_count(),
        # the fastest any overlap could make the sync run's CPU work on these cores
        "cpu_bound_ceiling": psutil.cpu_count() / sync_cores,
        "generation_share": sync_gen / sync_wall,
        "configurations": {},
    }
    for name, rs in runs.items():
        summary = {
            key: spread([r[key] for r in rs])
            for key in (
                "wall_s",
                "trainer_idle_ratio",
                "weight_sync_share",
                "weight_sync_s_per_step",
                "cores_busy",
                "cpu_s_per_update",
                "trainer_runqueue_wait_share",
            )
        }
        roles = {role for r in rs for role in r["cpu_s_per_update_by_role"]}
        summary["cpu_s_per_update_by_role"] = {
            role: statistics.median(r["cpu_s_per_update_by_role"].get(role, 0.0) for r in rs) for role in roles
        }
        for key in (
            "searcher_idle_ratio",
            "trajectories_generated_per_s",
            "trajectories_consumed_per_s",
            "unseen_group_frac",
            "staleness_mean",
            "searcher_prompts_ahead",
            "response_length_mean",
        ):
            if all(key in r for r in rs):
                summary[key] = spread([r[key] for r in rs])
        if all("weight_sync_phases_s_per_step" in r for r in rs):
            summary["weight_sync_phases_s_per_step"] = {
                phase: statistics.median(r["weight_sync_phases_s_per_step"][phase] for r in rs)
                for phase in rs[0]["weight_sync_phases_s_per_step"]
            }
        if name != "sync":
            summary["speedup_vs_sync"] = sync_wall / summary["wall_s"]["median"]
            summary["speedup_vs_sync_per_repeat"] = [s["wall_s"] / d["wall_s"] for s, d in zip(runs["sync"], rs)]
            summary["fraction_of_ideal_overlap"] = summary["speedup_vs_sync"] / result["ideal_overlap"]
            # CPU work per trained update relative to sync: above 1, the decoupled machinery costs CPU the overlap
            # would need
            summary["cpu_work_vs_sync"] = summary["cpu_s_per_update"]["median"] / sync_cpu
        result["configurations"][name] = summary
    result["goals"] = {
        "speedup_vs_sync": 1.5,
        "fraction_of_ideal_overlap": 0.9,
        "trainer_idle_ratio": 0.1,
        "weight_sync_share": 0.1,
        "generation_share": 0.5 if args.regime == "generation_bound" else None,
    }
    result["provenance"] = meta
    write_regime(args.out, args.regime, result)
    print(
        f"{'run':<18} | {'wall s (median, min-max)':>24} | {'speedup':>7} | {'trainer idle':>12} | "
        f"{'searcher idle':>13} | {'sync share':>10} | {'cores busy':>10} | {'CPU s/update':>12}"
    )
    for name, s in result["configurations"].items():
        wall = s["wall_s"]
        print(
            f"{name:<18} | {wall['median']:>8.1f} ({wall['min']:.1f}-{wall['max']:.1f}) {'':>6} | "
            f"{s.get('speedup_vs_sync', 1.0):>6.2f}x | {s['trainer_idle_ratio']['median']:>12.2f} | "
            f"{s.get('searcher_idle_ratio', {}).get('median', float('nan')):>13.2f} | "
            f"{s['weight_sync_share']['median']:>10.3f} | {s['cores_busy']['median']:>10.2f} | "
            f"{s['cpu_s_per_update']['median']:>12.2f}"
        )
    roles = [
        role
        for role in ROLE_ORDER
        if any(role in s["cpu_s_per_update_by_role"] for s in result["configurations"].values())
    ]
    print(
        "CPU s per update by role (medians); trainer workers' run-queue wait: share of the wall time their "
        "threads waited for a core"
    )
    print(f"{'run':<18} | " + " | ".join(f"{role[:14]:>14}" for role in roles) + f" | {'runqueue wait':>13}")
    for name, s in result["configurations"].items():
        print(
            f"{name:<18} | "
            + " | ".join(f"{s['cpu_s_per_update_by_role'].get(role, 0.0):>14.3f}" for role in roles)
            + f" | {s['trainer_runqueue_wait_share']['median']:>13.2f}"
        )
    print(
        f"{args.regime}: generation {result['generation_share']:.2f} of sync's wall; ideal overlap from the sync "
        f"runs' own timings: {result['ideal_overlap']:.2f}x; CPU-bound ceiling ({result['cores']} cores / sync's "
        f"busy cores): {result['cpu_bound_ceiling']:.2f}x; fraction of the ideal overlap: "
        + ", ".join(
            f"{n} {s['fraction_of_ideal_overlap']:.2f}" for n, s in result["configurations"].items() if n != "sync"
        )
        + f"; written to {args.out} (regimes.{args.regime})"
    )
    timeline({name: rs[0] for name, rs in runs.items()}, args.out.replace(".json", f"_{args.regime}.png"))
    cpu_by_role(result["configurations"], args.out.replace(".json", f"_{args.regime}_cpu.png"))


def write_regime(path: str, regime: str, result: dict) -> None:
    """One JSON for both regimes: this run's replaces its regime's entry and keeps the other's."""
    doc = {"regimes": {}}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        doc["regimes"] = old.get("regimes", {})  # a file of the one-regime layout is replaced whole
    doc["regimes"][regime] = result
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def display_name(name: str) -> str:
    """sync, decoupled_2, decoupled_1_paced -> what they are."""
    if name == "sync":
        return "sync (generate, then train)"
    n, paced = name.split("_")[1], name.endswith("_paced")
    return f"decoupled, {n} searcher{'s' if n != '1' else ''}" + (", paced" if paced else "")


def timeline(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    parts = [
        ("waiting for data", "tab:orange"),
        ("old log-probs", "tab:blue"),
        ("reference", "tab:cyan"),
        ("update", "tab:purple"),
        ("other", "tab:gray"),
        ("weight sync", "tab:red"),
        ("searchers busy", "tab:green"),
    ]
    colour = dict(parts)
    stages = [
        ("timing_s/old_log_prob", "old log-probs"),
        ("timing_s/ref", "reference"),
        ("timing_s/update_actor", "update"),
    ]
    # one shared time axis: the same work takes less wall-clock where generation overlaps training
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.7 * len(runs) + 1.0), squeeze=False, sharex=True)
    for ax, (name, r) in zip(axes[:, 0], runs.items()):
        t = 0.0
        for rec in r["records"][1:]:
            d = rec["data"]
            wait, step, sync = d["timing_s/gen"], d["timing_s/step"], d.get("tba/weight_sync_s", 0.0)
            ax.barh(2, wait, left=t, color=colour["waiting for data"])
            left = t + wait
            for key, part in stages:  # the trainer's own work, stage by stage (verl's timers)
                ax.barh(2, d.get(key, 0.0), left=left, color=colour[part])
                left += d.get(key, 0.0)
            ax.barh(2, max(t + step - sync - left, 0.0), left=left, color=colour["other"])
            ax.barh(2, sync, left=t + step - sync, color=colour["weight sync"])
            if "tba/searcher_idle_ratio" in d:  # measured between consecutive steps
                ax.barh(1, step * (1.0 - d["tba/searcher_idle_ratio"]), left=t, color=colour["searchers busy"])
            t += step
        ax.set_yticks([1, 2], ["searchers", "trainer"])
        ax.set_title(f"{display_name(name)}: {t:.0f} s for the measured updates", fontsize=9)
    axes[0, 0].legend(
        [Patch(color=c) for _, c in parts],
        [p for p, _ in parts],
        fontsize=7,
        ncol=4,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.25),
    )
    axes[-1, 0].set_xlabel("wall-clock seconds over the measured updates (the same work in every panel)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"timeline: {path}")


def cpu_by_role(configurations, path):
    """Stacked bars: CPU seconds per trained update by role, one bar per configuration (medians of repeats)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = [role for role in ROLE_ORDER if any(role in s["cpu_s_per_update_by_role"] for s in configurations.values())]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = list(configurations)
    bottom = [0.0] * len(names)
    for i, role in enumerate(roles):
        values = [configurations[n]["cpu_s_per_update_by_role"].get(role, 0.0) for n in names]
        ax.bar([display_name(n) for n in names], values, bottom=bottom, label=role, color=plt.cm.tab10(i % 10))
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, name in enumerate(names):
        ax.text(
            x,
            bottom[x],
            f"run-queue wait {configurations[name]['trainer_runqueue_wait_share']['median']:.2f}",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_ylabel("CPU seconds per trained update")
    ax.set_xlabel(
        "configuration (medians of repeats; above each bar: share of wall time trainer workers waited for a core)"
    )
    ax.set_title("Where the CPU goes per trained update, by part of the run", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"CPU by role: {path}")


if __name__ == "__main__":
    main()
