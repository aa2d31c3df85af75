"""Runs driven the way a user drives them (``tba-ext train`` as a subprocess): decoupled searchers on CPU (a trainer
and searcher replicas as separate Ray actors, weights every k steps through the Ray object-store checkpoint
engine; a searcher killed mid-run is restarted), verl's own Dr. GRPO serving each step's weights, Ctrl-C and a
frozen worker stopping everything."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
from conftest import SAME_WEIGHTS_KL, wait_for

from tba_ext.tools.processes import children, cmdline, session_pids
from tba_ext.tools.report import read_metrics

pytestmark = pytest.mark.e2e


def steps_logged(path):
    return read_metrics(path) if os.path.exists(path) else []


def start_train(config, run_dir, tmp_path, *overrides, env=None):
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tba_ext.cli",
            "train",
            "--config",
            config,
            "--log",
            str(tmp_path / "verl.log"),
            "--metrics",
            str(metrics),
            f"run_dir={run_dir}",
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, **(env or {})),
        preexec_fn=default_sigint,
    )
    return proc, metrics


def default_sigint():
    """Ctrl-C reaches the run even when the tests themselves were started in the background (``cmd &`` in a
    script ignores SIGINT, and an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def verl_session(proc):
    kids = [p for p in children(proc.pid) if "verl.trainer.main_ppo" in cmdline(p)]
    return kids[0] if kids else None


def test_two_free_running_searchers_sync_every_k_and_survive_the_death_of_one(tiny_run, tmp_path, margin, holds):
    """N = 2 searchers, each its own Ray actor process; one is SIGKILLed while the trainer is held after step 2:
    Ray restarts it, it starts from the newest published weights, and training goes on with both."""
    trace = tmp_path / "rollout_trace.jsonl"
    proc, metrics = start_train(
        "cpu_tba_decoupled",
        tiny_run,
        tmp_path,
        "trainer.total_training_steps=6",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "ray_kwargs.ray_init.num_gpus=3",
        "tba.ref_cache_check=true",
        env={"TBA_EXT_ROLLOUT_TRACE": str(trace), **holds.env("step_begin@3")},
    )
    try:
        holds.reached("step_begin@3", proc)  # the trainer held after two steps while the searchers run on
        sid = verl_session(proc)
        searchers = [p for p in session_pids(sid) if "HFCPUServer" in cmdline(p)]
        assert len(searchers) == 2  # each searcher is its own Ray actor process, apart from the trainer
        os.kill(searchers[0], signal.SIGKILL)
        holds.release("step_begin@3")
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    records = steps_logged(metrics)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    data = [r["data"] for r in records]
    assert max(d["replay/staleness_max"] for d in data) > 0
    # free-running, the trainer is fed distinct prompts from the first update on (the initial buffer, then the
    # next-freshest prompts when the newest version is sparse), at both local updates of every step
    for j in (1, 2):
        fracs = [d[f"replay/local_update_{j}/distinct_prompt_frac_min"] for d in data]
        margin(f"repeated-prompt share at local update {j}", 1.0 - min(fracs), 0.1)
    assert all(d["tba/weight_sync_s"] > 0 for d in data)
    # the searchers score every sample with their copy of the initial model (the restarted one too), and the
    # trainer's reference pass on the same rows (run here as a check) agrees to float32 rounding
    assert all(d["tba/ref_cached_frac"] == 1.0 for d in data)
    margin("searcher vs trainer reference l_ref", max(d["tba/ref_cache_max_sum_diff"] for d in data), 1e-3)
    assert data[-1]["tba/searchers_alive"] == 2  # the killed one was replaced
    for i in (0, 1):  # per-searcher figures, for both
        assert any(d.get(f"tba/searcher_{i}/generated_per_s", 0) > 0 for d in data), i
        assert any(d.get(f"tba/searcher_{i}/rows_per_batch", 0) >= 1 for d in data), i
        assert all(0.0 <= d.get(f"tba/searcher_{i}/idle_ratio", 0.0) <= 1.0 for d in data)
    assert all(0.0 <= d["tba/trainer_idle_ratio"] <= 1.0 for d in data)
    # where the data wait went: the k = 2 samples' parts (each a mean over them) and the prompt top-ups lie
    # within verl's "gen" timer, none negative; moving a finished batch into the store takes time
    for d in data:
        parts = [d[f"replay/{part}_s"] for part in ("ingest", "draw", "serve", "wait")]
        assert min(parts) >= 0.0 and d["timing_s/top_up"] >= 0.0, d
        assert 2 * sum(parts) + d["timing_s/top_up"] <= d["timing_s/gen"] + 1e-3, d
    assert all(d["replay/ingest_s"] > 0 for d in data if d["replay/ingested"] > 0)
    # the restarted searcher serves stamped weights: every trajectory it produced carries a version
    assert data[-1].get("replay/rejected_unknown_version", 0) == 0
    # the trajectory ledger balances at every step through the searcher's death, and accounts for each step's
    # rows (two local updates of half a batch; verl reduces the k samples' metrics, so the uses grow by the same
    # step's worth from step to step)
    assert all(d["ledger/unbalanced"] == 0.0 and d["ledger/unaccounted"] == 0 for d in data)
    uses = [d["ledger/uses"] for d in data]
    assert len({b - a for a, b in zip(uses, uses[1:])}) == 1 and uses[1] > uses[0]
    weights = [e for e in map(json.loads, trace.read_text().splitlines()) if e["event"] == "weights"]
    # one weight version per trainer step (each step = k local updates), in order within each searcher process
    # (a version received during a batch may be replaced by a newer one before it is applied); the restarted
    # searcher carries on from the newest
    by_process = {}
    for e in weights:
        by_process.setdefault(e["pid"], []).append(e["global_steps"])
    assert len(by_process) >= 2 and all(v == sorted(v) for v in by_process.values())  # 3 with the restarted one
    assert weights[0]["global_steps"] == 0 and max(e["global_steps"] for e in weights) >= 5
    assert not session_pids(verl_session(proc) or -1)


def test_dr_grpo_trains_its_rollout_serves_the_new_weights_and_ctrl_c_stops_everything(
    tiny_run, tmp_path, margin, holds
):
    """verl's own Dr. GRPO pipeline on CPU (one run, two checks that do not interfere): it trains and the rollout
    serves each step's new weights; Ctrl-C after step 3 stops the run and every process of its session."""
    trace = tmp_path / "rollout_trace.jsonl"
    proc, metrics = start_train(
        "cpu_drgrpo",
        tiny_run,
        tmp_path,
        "trainer.total_training_steps=50",
        env={"TBA_EXT_ROLLOUT_TRACE": str(trace), **holds.env("generate_begin@3")},
    )
    # verl's own trainer has no tba-ext hold point: the rollout holds as it starts generating with step 3's weights
    holds.reached("generate_begin@3", proc)  # Ctrl-C stops a held run too
    sid = verl_session(proc)
    assert sid and session_pids(sid)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted" in out
    wait_for(lambda: not session_pids(sid), 30, "the verl session to be empty")

    records = steps_logged(metrics)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)) and len(records) >= 3
    data = [r["data"] for r in records]
    assert all(math.isfinite(d["actor/pg_loss"]) for d in data)
    assert max(d["actor/grad_norm"] for d in data) > 0
    loads = [e for e in map(json.loads, trace.read_text().splitlines()) if e["event"] == "weights"]
    versions = [x["global_steps"] for x in loads]
    assert versions == sorted(versions) and versions[-1] >= 2  # synced after every step
    assert len({x["checksum"] for x in loads}) > 1  # the rollout really received changed weights
    # and what it serves is what the trainer holds: rollout probabilities = recomputed old ones, up to float32
    # (incremental decoding vs one forward pass: ~1e-6 on probabilities; a stale weight version moves them by
    # ~1e-2 at this learning rate)
    margin("rollout vs trainer prob diff", max(d["training/rollout_probs_diff_max"] for d in data), 1e-4)


def test_a_frozen_rollout_worker_ends_the_run_with_a_clear_message(tiny_run, tmp_path, holds):
    """A worker that hangs (here: the rollout server SIGSTOPped after step 1) leaves verl waiting forever; the
    launcher's watchdog stops the run, says why, and leaves no process of the session behind."""
    proc, metrics = start_train(
        "cpu_tb",
        tiny_run,
        tmp_path,
        "--stall-timeout",
        "15",  # counted from step 1, which the test holds the trainer after until the server is stopped
        "trainer.total_training_steps=20",
        env=holds.env("step_begin@2"),
    )
    try:
        holds.reached("step_begin@2", proc)
        sid = verl_session(proc)
        servers = [p for p in session_pids(sid) if "HFCPUServer" in cmdline(p)]
        assert len(servers) == 1
        os.kill(servers[0], signal.SIGSTOP)
        holds.release("step_begin@2")  # step 2 goes on and waits forever for the stopped server
        out, _ = proc.communicate(timeout=600)  # without a limit this would never return
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "no training step finished in 15s after step" in out, out[-3000:]
    assert len(steps_logged(metrics)) < 20
    assert not session_pids(sid)


def test_a_replay_store_left_without_servable_data_stops_the_run_naming_wait_timeout_s(tiny_run, tmp_path):
    """Generation stops delivering (the reward function hangs from the third batch on) while every stored
    trajectory is staler than max_staleness = 0: the sampler waits wait_timeout_s for data, then stops the run
    with its own message, long before the launcher's watchdog, and leaves no process behind."""
    fn = tmp_path / "hanging_reward.py"
    fn.write_text(
        "import time\n"
        "from tba_ext.tasks.rewards import compute_score as good\n"
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls > 64:  # batches 1 and 2 of 8 prompts x 4 are scored, then nothing more\n"
        "        time.sleep(3600)\n"
        "    return good(data_source, solution_str, ground_truth, extra_info)\n"
    )
    proc, metrics = start_train(
        "cpu_tba",
        tiny_run,
        tmp_path,
        "--stall-timeout",
        "300",
        "trainer.total_training_steps=20",
        f"reward.custom_reward_function.path={fn}",
        "trainer.v1.sampler.sampler_kwargs.max_staleness=0",
        "+trainer.v1.sampler.sampler_kwargs.wait_timeout_s=15",
    )
    try:
        wait_for(lambda: verl_session(proc), 600, "the verl session", proc)
        sid = verl_session(proc)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert (
        "could not serve 8 groups for 15 s" in out and "Raise trainer.v1.sampler.sampler_kwargs.wait_timeout_s" in out
    ), out[-3000:]
    assert "no training step finished" not in out  # the sampler's limit, not the watchdog's
    assert 1 <= len(steps_logged(metrics)) < 20
    assert not session_pids(sid)


def test_decoupled_reference_reset_in_its_own_worker_group_and_beta_per_update(tiny_run, tmp_path, margin):
    """tba_separate_async with the reference in its own worker group (hybrid_engine=False), k = 2 updates per
    step, rho = 3 updates (not a multiple of k): the reference takes the actor's weights after updates 3, 6 and 9,
    inside steps 2 and 5 as at the end of step 3, so the KL between the policy and the reference at an update's
    forward is zero at updates 1, 4, 7 and 10 and not at the others (a reference moved only at the end of a step
    would be zero at updates 1, 5 and 7); beta follows the paper's formula at the step's first update. The
    searchers are paced (tba.searcher_prompts_per_consumed=1): never more than the queue (32 prompts) ahead of the
    trainer."""
    from tba_ext.core.tb import beta_at_step, first_update

    proc, metrics = start_train(
        "cpu_tba_decoupled",
        tiny_run,
        tmp_path,
        "trainer.total_training_steps=5",
        "tba.ref_reset_every=3",
        "tba.beta.final=0.01",
        "tba.beta.anneal_steps=8",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "tba.searcher_prompts_per_consumed=1.0",
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    data = [r["data"] for r in steps_logged(metrics)]
    assert len(data) == 5
    # policy vs reference at each update's forward, update u = 2 (step - 1) + local update
    kl = [d[f"tb/local_update_{local}/kl"] for d in data for local in (1, 2)]
    for u in (1, 4, 7, 10):
        margin(f"KL at update {u} (reference = policy)", abs(kl[u - 1]), SAME_WEIGHTS_KL)
    for u in (2, 3, 5, 6, 8, 9):
        margin(f"KL at update {u} (policy moved)", abs(kl[u - 1]), SAME_WEIGHTS_KL, below=False)
    assert [d["tba/reference_updates"] for d in data] == [0, 1, 2, 2, 3]
    assert [d["tb/kl_step_start"] for d in data] == pytest.approx(kl[::2])
    assert [d["tb/beta"] for d in data] == pytest.approx(
        [beta_at_step(first_update(g, 2), 0.05, 0.01, 8) for g in range(1, 6)]
    )
    # reference log-probs: the searchers' (initial model) serve until the first reset (update 3), after it none
    # of theirs is: update 4 computes every row (the zero KL above); before it the trainer runs no reference
    # pass: one call per update
    assert data[0]["tba/ref_cached_frac"] == 1.0
    assert data[0]["tba/trainer_calls_per_update"] == 1.0
    assert data[1]["tba/ref_computed_frac"] >= 0.5
    # staleness in optimizer updates at each local update: versions are whole steps of k = 2 updates, so data
    # served at local update 1 is an even number of updates old and at local update 2 an odd number (>= 1: the
    # weights of the update just made were never published)
    first = [d[f"replay/local_update_1/staleness_{e}"] for d in data for e in ("min", "max")]
    second = [d[f"replay/local_update_2/staleness_{e}"] for d in data for e in ("min", "max")]
    assert all(s % 2 == 0 for s in first) and all(s % 2 == 1 for s in second), (first, second)
    assert max(first + second) >= 2  # data from before the step's weights was used
    ahead = [d["tba/searcher_prompts_ahead"] for d in data]
    assert max(ahead) <= 32 and max(ahead) >= 16, ahead  # never past the queue's lead; the lead was used
