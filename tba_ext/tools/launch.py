"""Launch verl's own ``main_ppo`` on a checked config: the environment it runs in, joining a Ray cluster or
starting its own, progress lines, a stall watchdog, and a stop that leaves no process of the run behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tba_ext.tools.config import check_overrides_are_read, compose, config_location, preflight
from tba_ext.tools.processes import session_pids, terminate

# What a Ray cluster's nodes own (``ray start --num-cpus/--num-gpus/...``): ray.init refuses them when it joins one
CLUSTER_OWNED_RAY_KEYS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config")


def ray_overrides(cfg, ray_tmp: str, worker_env: dict[str, str]) -> list[str]:
    """Alone, a run starts its own one-node Ray in a private temp dir, whose workers inherit the launcher's
    environment. Given a cluster to join (``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``, e.g. nodes started
    with ``ray start``), it joins it: the config's resource keys, which ray.init would refuse, are dropped (the
    nodes declared their resources), and what the launcher adds to the environment (``worker_env``) reaches the
    workers through the job's runtime_env, since they are children of the nodes, not of this process."""
    ray_init = cfg.get("ray_kwargs", {}).get("ray_init", {}) or {}
    if ray_init.get("address") or os.environ.get("RAY_ADDRESS"):
        dropped = [f"~ray_kwargs.ray_init.{key}" for key in CLUSTER_OWNED_RAY_KEYS if ray_init.get(key) is not None]
        env_vars = [
            f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}='{_quoted(value)}'"
            for name, value in sorted(worker_env.items())
        ]
        return dropped + env_vars
    return [f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]


def joined_cluster_runtime(cfg) -> str | None:
    """For a run joining a Ray cluster: ``off`` when any node of the cluster has a GPU, else ``on`` (the CPU
    runtime), asked of the cluster rather than of this node, which may be a CPU-only head node of a GPU
    cluster. None for a run that starts its own Ray (this machine is its cluster)."""
    address = (cfg.get("ray_kwargs", {}).get("ray_init", {}) or {}).get("address") or os.environ.get("RAY_ADDRESS")
    if not address:
        return None
    import ray

    from tba_ext.cpu.runtime import cluster_has_gpu

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return "off" if cluster_has_gpu(ray.nodes()) else "on"
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set for the duration, restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _quoted(value: str) -> str:
    """A value inside a single-quoted Hydra override string."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


# Defaults for verl's process tree, each applied only where the user's environment does not set it.
ENV_DEFAULTS = {
    # Ray's GCS keeps every task's events (100k by default): measured +48 MB per 100 CPU steps in a long run;
    # with 1000 the whole run grew 17 MB per 100 steps (benchmarks/long_run.py). Nothing here reads them.
    "RAY_task_events_max_num_task_in_gcs": "1000",
    "RAY_DEDUP_LOGS": "0",  # every worker's lines reach the log (the launcher reads errors from them)
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # the head node is started by this process for this run only
    "TOKENIZERS_PARALLELISM": "false",
}
# ... and on a CPU host only: one thread per worker process (many share few cores), no model hub (the CPU
# runs build their models offline)
CPU_ENV_DEFAULTS = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def launch_env(environ, cpu_host: bool, extra: dict | None = None) -> dict:
    """The environment verl runs in: the user's, plus defaults for what they left unset, plus ``extra``."""
    defaults = dict(ENV_DEFAULTS, **(CPU_ENV_DEFAULTS if cpu_host else {}))
    return dict(defaults, **environ, **(extra or {}))


def run_verl(
    config_name: str,
    overrides: list[str],
    log_path: str | None = None,
    check: bool = True,
    metrics_path: str | None = None,
    extra_env: dict | None = None,
    stall_timeout: float | None = None,
    startup_timeout: float = 1800.0,
) -> int:
    """Run ``python -m verl.trainer.main_ppo`` with our config dir; returns its exit code.

    ``metrics_path``: verl's own file logger writes every step's metrics there as JSONL.
    ``stall_timeout``: stop the run when no training step finishes for this many seconds (a hung or frozen
    worker leaves verl waiting forever); the first step may take ``startup_timeout``. Default from
    ``TBA_EXT_STALL_TIMEOUT`` (unset: no limit).
    """
    if stall_timeout is None and os.environ.get("TBA_EXT_STALL_TIMEOUT"):
        stall_timeout = float(os.environ["TBA_EXT_STALL_TIMEOUT"])
    cfg, extra_env, cpu_host = _checked_config(config_name, overrides, extra_env)
    env = launch_env(os.environ, cpu_host=cpu_host, extra=extra_env)
    logger = []
    if metrics_path:
        env["VERL_FILE_LOGGER_PATH"] = os.path.abspath(metrics_path)
        logger = ["trainer.logger=[console,file]"]
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        ray_tmp = tempfile.mkdtemp(prefix="tba_ray_", dir="/tmp")
        cmd = _verl_command(config_name, overrides, cfg, ray_tmp, env, logger)
        progress = _Progress(int(cfg.trainer.total_training_steps or 0))
        log = open(log_path, "w" if attempt == 1 else "a") if log_path else None
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        reader, causes, ray_start_failed = _start_reader(proc, log, progress)
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            rc, stalled = _wait_or_stop_stalled(proc, progress, stall_timeout, startup_timeout)
        except (KeyboardInterrupt, _Terminated):
            terminate(proc)
            raise KeyboardInterrupt from None
        finally:
            signal.signal(signal.SIGTERM, previous)
            _end_run(proc, reader, log, ray_tmp)
        if rc == 0 or stalled or not ray_start_failed or attempt == RAY_START_ATTEMPTS:
            break
        print(f"Ray's node did not register in time (attempt {attempt} of {RAY_START_ATTEMPTS}): starting it again")
    _raise_if_failed(rc, stalled, check, causes, log_path)
    return rc


# Ray gives a new node 30 s to register with its GCS (ray/_private/node.py, a constant) and raises this before
# anything of the run has started; an overloaded machine can miss that, so the launch is made again on a fresh node
RAY_START_TIMEOUT = "The current node timed out during startup"
RAY_START_ATTEMPTS = 3


def _checked_config(config_name: str, overrides: list[str], extra_env: dict | None):
    """The composed config, checked as the run will see it; ``extra_env`` plus the joined cluster's runtime
    choice; and whether this host runs the CPU runtime."""
    from tba_ext.cpu.runtime import OVERRIDE_ENV, cpu_runtime_active

    check_overrides_are_read(config_name, overrides)
    cfg = compose(config_name, overrides)
    extra_env = dict(extra_env or {})
    if OVERRIDE_ENV not in os.environ and (runtime := joined_cluster_runtime(cfg)):
        extra_env[OVERRIDE_ENV] = runtime  # the cluster's choice, for this process's checks and every worker
    with _environ({k: v for k, v in extra_env.items() if k == OVERRIDE_ENV}):
        preflight(cfg)
        cpu_host = cpu_runtime_active()
    return cfg, extra_env, cpu_host


def _verl_command(config_name: str, overrides: list[str], cfg, ray_tmp: str, env: dict, logger: list[str]):
    """The ``main_ppo`` command line: our config, the user's overrides, then the launcher's own."""
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    config_dir, name, extra = config_location(config_name)
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "--config-path",
        config_dir,
        "--config-name",
        name,
        *extra,
        *overrides,
        *ray_overrides(cfg, ray_tmp, added),
        f"hydra.run.dir={ray_tmp}/hydra",  # not ./outputs/<date> in the caller's working directory
        *logger,
    ]


def _start_reader(proc, log, progress: _Progress) -> tuple[threading.Thread, list[str], list[str]]:
    """A thread copying the run's output to ``log`` and progress lines to stdout; also returns the list it
    fills with the first error tba-ext raised inside Ray, and the one it fills when Ray's node failed to start
    (RAY_START_TIMEOUT)."""
    causes: list[str] = []  # the first error tba-ext raised inside Ray; verl's own final error hides it
    ray_start_failed: list[str] = []

    def remember_cause(line: str) -> None:
        match = _TBA_ERROR.search(line)
        if match and not causes:
            causes.append(match.group(0).strip())
        if RAY_START_TIMEOUT in line:
            ray_start_failed.append(line)

    def pump():  # Ray's daemons inherit the pipe, so reading runs in its own thread and never blocks exit
        for line in proc.stdout:
            remember_cause(line)
            if log and not log.closed:
                log.write(line)
                log.flush()
            summary = progress.line(line)  # also the stall watchdog's clock
            shown = line if _verbose() else summary
            if shown is None and ("Error" in line or "error:" in line) and "Warning" not in line:
                shown = line
            if shown:
                sys.stdout.write(shown)
                sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return reader, causes, ray_start_failed


def _wait_or_stop_stalled(
    proc, progress: _Progress, stall_timeout: float | None, startup_timeout: float
) -> tuple[int, str | None]:
    """Wait for the run to exit, or stop it once the watchdog finds it stalled: its exit code and why it was
    stopped (None when it exited by itself)."""
    while True:
        try:
            return proc.wait(timeout=0.5), None
        except subprocess.TimeoutExpired:
            stalled = progress.stalled(stall_timeout, startup_timeout) if stall_timeout else None
            if stalled:
                terminate(proc)
                return (proc.returncode if proc.returncode is not None else -9), stalled


def _end_run(proc, reader: threading.Thread, log, ray_tmp: str) -> None:
    """Stop what is left of the run and remove its temp dir."""
    # the run is over: Ray's daemons and workers go with it, even when verl's shutdown hangs or the
    # driver was killed
    if session_pids(proc.pid):
        terminate(proc)
    reader.join(timeout=10)
    if log:
        log.close()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _raise_if_failed(rc: int, stalled: str | None, check: bool, causes: list[str], log_path: str | None) -> None:
    """A stalled run, or with ``check`` a non-zero exit, raises RuntimeError naming the first tba-ext error."""
    if stalled:
        cause = f"; first error seen: {causes[0]}" if causes else ""
        where = f"; full log: {log_path}" if log_path else ""
        raise RuntimeError(f"{stalled}, so the run was stopped{cause}{where}")
    if check and rc != 0:
        cause = f": {causes[0]}" if causes else ""
        raise RuntimeError(f"verl exited with code {rc}{cause}" + (f"; full log: {log_path}" if log_path else ""))


_TBA_ERROR = re.compile(r"tba_ext\.[\w.]+Error: .*")


class _Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated()


def _verbose() -> bool:
    return os.environ.get("TBA_EXT_VERBOSE", "0") == "1"


class _Progress:
    """Turns verl's long ``step:N - key:value - ...`` console lines into one short progress line each."""

    KEYS = (
        ("critic/score/mean", "reward"),
        ("actor/pg_loss", "loss"),
        ("tb/beta", "beta"),
        ("replay/fraction", "replay"),
        ("replay/staleness_mean", "staleness"),
    )

    def __init__(self, total: int):
        self.total, self.start = total, time.time()
        self.last_step, self.last_step_time = 0, None

    def stalled(self, stall_timeout: float, startup_timeout: float) -> str | None:
        """Why the run counts as hung, or None."""
        now = time.time()
        if self.last_step_time is None:
            if now - self.start > startup_timeout:
                return f"no training step finished within {startup_timeout:.0f}s of the start"
        elif now - self.last_step_time > stall_timeout:
            return f"no training step finished in {stall_timeout:.0f}s after step {self.last_step}"
        return None

    def line(self, raw: str) -> str | None:
        text = raw.split("\x1b[0m", 1)[-1].strip()
        if not text.startswith("step:"):
            return None
        fields = dict(part.split(":", 1) for part in text.split(" - ") if ":" in part)
        step = int(fields.get("step", "0"))
        self.last_step, self.last_step_time = step, time.time()
        elapsed = time.time() - self.start
        parts = [f"step {step}/{self.total}"]
        for key, label in self.KEYS:
            if key in fields:
                try:
                    parts.append(f"{label} {float(fields[key]):.4g}")
                except ValueError:
                    pass
        if step and self.total:
            parts.append(f"elapsed {elapsed:.0f}s, ETA {elapsed / step * (self.total - step):.0f}s")
        return "  " + " | ".join(parts) + "\n"
