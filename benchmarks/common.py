"""What the verl-launching benchmarks share: their command line, a prepared run folder (arith task unless told)
and provenance."""

import argparse
import datetime
import os
import platform
import re
import subprocess

import psutil

from tba_ext.tasks.data import corpus_for, write_task
from tba_ext.tools.models import ModelSpec, make_model
from tba_ext.tools.warmstart import warm_start


def parse_args(name: str, steps: int, extra=None):
    """--steps, --run-dir, --out (benchmarks/results/<name>...), plus ``extra(parser)``'s options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--run-dir", default=f"benchmarks/results/{name}_run")
    parser.add_argument("--out", default=f"benchmarks/results/{name}.json")
    if extra:
        extra(parser)
    return parser.parse_args()


def prepare_run(run_dir: str, train_size: int, size: str = "tiny", warm_steps: int = 150, task: str = "arith") -> str:
    """An offline model (warm-started unless ``warm_steps`` is 0, then in ``model/``) and a task (arith unless
    told)."""
    run = os.path.abspath(run_dir)
    init = f"{run}/model_init" if warm_steps else f"{run}/model"
    make_model(init, corpus_for(task, 0), ModelSpec(size=size, seed=0))
    write_task(task, f"{run}/data", train_size, 64, 0)
    if warm_steps:
        warm_start(init, f"{run}/data/train.parquet", f"{run}/model", steps=warm_steps, log_every=0)
    return run


# the rollout scores each sample with its copy of the initial model (TBA's searcher): no reference pass on the trainer
SEARCHER_REFERENCE = "+actor_rollout_ref.rollout.custom.reference_logprobs=true"

GENERIC_KINDS = ("ray worker", "IDLE")  # a Ray worker before it runs an actor or task, or between tasks
# Ray's daemons and the run's driver / launcher, by what their command lines name
DAEMON_KINDS = ("raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env", "main_ppo", "tba_ext.cli")


def process_kind(proc: psutil.Process) -> str:
    """What a process of a verl run is: the actor class in Ray's process title (``ray::<actor class>[.<method>]``),
    else the Ray daemon or driver its command line names, else its executable."""
    title = " ".join(proc.cmdline()) or proc.name()
    match = re.match(r"ray::([A-Za-z_]+)", title)
    if match:
        return match.group(1)
    if "default_worker.py" in title:
        return "ray worker"
    for known in DAEMON_KINDS:
        if known in title:
            return known
    return os.path.basename(title.split()[0]) if title else proc.name()


def same_process_kind(kind: str, before: str | None) -> str:
    """A worker keeps the first actor class it ran (its title changes per method, and is IDLE between tasks)."""
    if before and (kind in GENERIC_KINDS or before not in GENERIC_KINDS):
        return before
    return kind


def cpu_kernels() -> dict:
    """What this process's CPU kernels are: torch's vector unit (ATEN_CPU_CAPABILITY picks it; a float32 run's
    numbers depend on it), its threads and the CPU model."""
    import torch

    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), None)
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
        "torch_threads": torch.get_num_threads(),
        "cpu_model": model or platform.processor() or None,
    }


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []


def provenance() -> dict:
    """Where and how a result was made: commit, versions, machine and its CPU kernels, date and the load seen when
    it started."""
    import importlib.metadata as md

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    import tba_ext

    # the checkout the imported tba_ext came from (a study run from a worktree through PYTHONPATH ran that code, not
    # the current folder's); the current folder where tba_ext is installed from a wheel
    package = os.path.dirname(os.path.abspath(tba_ext.__file__))

    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, cwd=package)
    where = package if inside.stdout.strip() == "true" else None

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=where).stdout.strip()

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {
        "commit": commit,
        "dirty": dirty,
        "tba_ext": version("tba-ext"),
        "verl": version("verl"),
        "torch": version("torch"),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        **cpu_kernels(),
        "load_avg_1m_at_start": os.getloadavg()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
