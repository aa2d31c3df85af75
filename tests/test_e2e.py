"""Real verl runs on CPU: python -m verl.trainer.main_ppo, Ray, FSDP2 on gloo, the hfcpu rollout, tiny model.

Each launch costs about a minute of Ray/TransferQueue start-up, so the suite keeps them few.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from tba_ext.adapters.trainer import REPLAY_FILE
from tba_ext.launch import run_verl

pytestmark = pytest.mark.e2e


def read_metrics(path):
    return [json.loads(line) for line in open(path)]


def series(records, key):
    return [r["data"][key] for r in records if key in r["data"]]


def test_dr_grpo_trains_and_the_rollout_serves_the_new_weights(tiny_run, tmp_path):
    metrics, trace = tmp_path / "metrics.jsonl", tmp_path / "rollout_trace.jsonl"
    run_verl("cpu_drgrpo", [f"run_dir={tiny_run}", "trainer.total_training_steps=3"],
             log_path=str(tmp_path / "verl.log"), metrics_path=str(metrics),
             extra_env={"TBA_EXT_ROLLOUT_TRACE": str(trace)})
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(x) for x in series(records, "actor/pg_loss"))
    assert max(series(records, "actor/grad_norm")) > 0
    loads = [json.loads(x) for x in trace.read_text().splitlines()]
    versions = [x["global_steps"] for x in loads]
    assert versions == sorted(versions) and versions[-1] >= 2  # synced after every step
    checksums = [x["checksum"] for x in loads]
    assert len(set(checksums)) > 1  # the rollout really received changed weights
    # and what it serves is what the trainer holds: rollout log-probs = recomputed old log-probs
    assert max(series(records, "training/rollout_probs_diff_max")) < 1e-4


def test_tba_replay_trains_on_stale_data_and_resumes_after_kill_9(tiny_run, tmp_path):
    """TB + replay in colocate_async; the driver is killed with SIGKILL mid-run, after a checkpoint; the
    resumed run continues the step count without double counting and restores the saved replay store."""
    import signal
    import time

    from tba_ext.core.replay import load_checked
    from tba_ext.launch import children, cmdline, session_pids

    def steps_logged(path):
        return read_metrics(path) if os.path.exists(path) else []

    ckpt = tmp_path / "ckpt"
    common = [f"run_dir={tiny_run}", f"trainer.default_local_dir={ckpt}", "trainer.save_freq=2",
              "trainer.total_training_steps=6"]
    first = tmp_path / "first.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tba_ext.cli", "train", "--config", "cpu_tba", "--log",
                             str(tmp_path / "first.log"), "--metrics", str(first), *common],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while len(steps_logged(first)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    driver = [p for p in children(proc.pid) if "verl.trainer.main_ppo" in cmdline(p)][0]
    os.kill(driver, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "verl exited with code -9" in out
    assert not session_pids(driver)  # the launcher cleaned up the killed run's Ray processes

    records = read_metrics(first)
    assert max(series(records, "replay/fraction")) > 0
    assert max(series(records, "replay/staleness_max")) > 0
    assert max(series(records, "training/off_policy/trajectory_staleness/max")) > 0  # verl's own view agrees
    for key in ("tb/beta", "tb/log_z", "tb/kl", "tb/zero_reward_variance_frac", "tb/mean_abs_advantage",
                "actor/tb/residual_var"):
        assert all(math.isfinite(x) for x in series(records, key)), key
    assert max(series(records, "actor/grad_norm")) > 0

    last = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert last >= 2 and last < 6
    saved = ckpt / f"global_step_{last}" / REPLAY_FILE
    saved_bytes = saved.read_bytes()
    n_saved = len(load_checked(str(saved))["sampler"]["store"]["trajectories"])

    second = tmp_path / "second.jsonl"
    run_verl("cpu_tba", common + ["trainer.resume_mode=auto"], log_path=str(tmp_path / "second.log"),
             metrics_path=str(second))
    resumed = read_metrics(second)
    assert [r["step"] for r in resumed] == list(range(last + 1, 7))  # continues, no double counting
    assert series(resumed, "replay/restored_trajectories") == [n_saved]
    assert saved.read_bytes() == saved_bytes  # resuming never rewrites the old checkpoint


def test_bad_input_is_refused_before_ray_starts(tiny_run, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tba_ext.cli", *args], capture_output=True, text=True,
                              timeout=300)

    r = cli("train", "--config", "cpu_tb", f"run_dir={tiny_run}", f"actor_rollout_ref.model.path={tmp_path}/none")
    assert r.returncode == 2 and "actor_rollout_ref.model.path" in r.stderr and "Traceback" not in r.stderr
    r = cli("train", "--config", "cpu_tb", f"run_dir={tiny_run}", f"data.train_files={tmp_path}/none.parquet")
    assert r.returncode == 2 and "data.train_files" in r.stderr
    r = cli("train", "--config", "cpu_tb", f"run_dir={tiny_run}", "actor_rollout_ref.rollout.n=1")
    assert r.returncode == 2 and "actor_rollout_ref.rollout.n" in r.stderr
    r = cli("train", "--config", "cpu_tb", f"run_dir={tiny_run}", "actor_rollout_ref.rollout.name=vllm")
    assert r.returncode == 2 and "actor_rollout_ref.rollout.name=vllm" in r.stderr
    r = cli("train", "--config", "cpu_tba", f"run_dir={tiny_run}",
            "trainer.v1.sampler.sampler_kwargs.recency_prob=2.0")
    assert r.returncode == 2 and "sampler_kwargs.recency_prob" in r.stderr
