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


def test_tba_with_replay_trains_on_stale_replayed_data_then_resumes(tiny_run, tmp_path):
    ckpt = tmp_path / "ckpt"
    common = [f"run_dir={tiny_run}", f"trainer.default_local_dir={ckpt}", "trainer.save_freq=2"]
    first = tmp_path / "first.jsonl"
    run_verl("cpu_tba", common + ["trainer.total_training_steps=4"], log_path=str(tmp_path / "first.log"),
             metrics_path=str(first))
    records = read_metrics(first)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert max(series(records, "replay/fraction")) > 0
    assert max(series(records, "replay/staleness_max")) > 0
    assert max(series(records, "training/off_policy/trajectory_staleness/max")) > 0  # verl's own view agrees
    for key in ("tb/beta", "tb/log_z", "tb/kl", "tb/zero_reward_variance_frac", "tb/mean_abs_advantage",
                "actor/tb/residual_var"):
        assert all(math.isfinite(x) for x in series(records, key)), key
    assert max(series(records, "actor/grad_norm")) > 0
    saved = ckpt / "global_step_4" / REPLAY_FILE
    assert saved.exists() and (ckpt / "global_step_2" / REPLAY_FILE).exists()
    saved_bytes = saved.read_bytes()

    second = tmp_path / "second.jsonl"
    run_verl("cpu_tba", common + ["trainer.total_training_steps=5", "trainer.resume_mode=auto"],
             log_path=str(tmp_path / "second.log"), metrics_path=str(second))
    resumed = read_metrics(second)
    assert [r["step"] for r in resumed] == [5]  # continues, no double counting
    # the restored store is the saved one: its size before step 5's ingestion equals the checkpoint's
    from tba_ext.core.replay import load_checked

    state = load_checked(str(saved))
    n_saved = len(state["sampler"]["store"]["trajectories"])
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
