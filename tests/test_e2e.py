"""Real verl runs on CPU: python -m verl.trainer.main_ppo, Ray, FSDP2 on gloo, the hfcpu rollout, tiny model.

Each launch costs about a minute of Ray/TransferQueue start-up, so the suite keeps them few.
"""

import math
import os
import subprocess
import sys

import pytest
from conftest import SAME_WEIGHTS_KL, SAME_WEIGHTS_LOGPROB

from tba_ext.adapters.reference import REFERENCE_DIR
from tba_ext.core.replay import REPLAY_FILE
from tba_ext.tools.launch import run_verl
from tba_ext.tools.report import read_metrics

pytestmark = pytest.mark.e2e


def series(records, key):
    return [r["data"][key] for r in records if key in r["data"]]


def test_tba_replay_trains_on_stale_data_and_resumes_after_kill_9_twice(tiny_run, tmp_path, margin, holds):
    """TB + replay in colocate_async, one run of 6 steps killed with SIGKILL twice: right after its step-2
    checkpoint, then (resumed) once it has read step 5's trajectories into its journal, after the step-4 checkpoint;
    each resumed run continues the step count without double counting, restores the saved replay store, the
    journal's trajectories (none read is lost) and the moved reference, and carries on the beta schedule. Two
    mini-batches per step: every count is in optimizer updates, two per global step; the reference is reset every
    4 updates (after steps 2, 4, 6, before their checkpoints)."""
    import signal

    from tba_ext.core.journal import JOURNAL_FILE, read_journal
    from tba_ext.core.replay import load_checked
    from tba_ext.core.tb import beta_at_step, first_update, wsd_lr_ratio
    from tba_ext.tools.processes import children, cmdline, session_pids

    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    beta_init, beta_final, anneal = 0.05, 0.01, 6
    common = [
        f"run_dir={tiny_run}",
        f"trainer.default_local_dir={ckpt}",
        "trainer.save_freq=2",
        "trainer.total_training_steps=6",
        f"algorithm.kl_ctrl.kl_coef={beta_init}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "tba.ref_reset_every=4",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # the policy moves enough for a wrong reference to show
        f"tba.beta.final={beta_final}",
        f"tba.beta.anneal_steps={anneal}",
        "trainer.resume_mode=auto",
        # the paper's warmup-stable-decay learning rate, in updates: warmup 2, stable 4, decay 6
        "tba.lr_schedule.name=wsd",
        "tba.lr_schedule.warmup_updates=2",
        "tba.lr_schedule.stable_updates=4",
        "tba.lr_schedule.decay_updates=6",
    ]

    def run_killed(name, point):
        """Start a run held at ``point``; once it is held there, kill -9 its verl driver."""
        metrics = tmp_path / f"{name}.jsonl"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tba_ext.cli",
                "train",
                "--config",
                "cpu_tba",
                "--log",
                str(tmp_path / f"{name}.log"),
                "--metrics",
                str(metrics),
                *common,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, TBA_EXT_ROLLOUT_TRACE=str(trace), **holds.env(point)),
        )
        try:
            holds.reached(point, proc)
            drivers = [p for p in children(proc.pid) if "verl.trainer.main_ppo" in cmdline(p)]
            assert len(drivers) == 1, f"the launcher's verl driver, held at {point}: found {drivers}"
            os.kill(drivers[0], signal.SIGKILL)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1 and "verl exited with code -9" in out, out[-3000:]
        assert not session_pids(drivers[0])  # the launcher cleaned up the killed run's Ray processes
        return read_metrics(metrics)

    def saved_store(step):
        saved = ckpt / f"global_step_{step}" / REPLAY_FILE
        assert (ckpt / f"global_step_{step}" / REFERENCE_DIR).is_dir()  # the reset reference, saved with it
        return saved.read_bytes(), len(load_checked(str(saved))["sampler"]["store"]["trajectories"])

    first = run_killed("first", "checkpoint_saved@2")  # the trainer held right after its step-2 checkpoint
    assert int(tracker.read_text()) == 2
    bytes_2, n_saved_2 = saved_store(2)

    # the trainer held once step 5's trajectories are in the journal, read after its step-4 checkpoint
    second = run_killed("second", "trajectories_journaled@5")
    assert [r["step"] for r in second][:2] == [3, 4]  # continues, no double counting
    assert series(second, "replay/restored_trajectories") == [n_saved_2]
    last = int(tracker.read_text())
    assert last == 4 and (ckpt / "global_step_2" / REPLAY_FILE).read_bytes() == bytes_2  # never rewritten
    bytes_4, n_saved_4 = saved_store(4)
    journal, cut = read_journal(str(ckpt / "global_step_4" / JOURNAL_FILE))
    journaled = sum(len(record["entries"]) for record in journal)
    assert journaled > 0 and cut == 0  # step 5's read, durable before the kill
    ids_4 = len(load_checked(str(ckpt / "global_step_4" / REPLAY_FILE))["sampler"]["store"]["ledger"]["place"])

    third_path = tmp_path / "third.jsonl"
    run_verl("cpu_tba", common, log_path=str(tmp_path / "third.log"), metrics_path=str(third_path))
    third = read_metrics(third_path)
    assert [r["step"] for r in third] == [5, 6]
    assert series(third, "replay/restored_trajectories") == [n_saved_4]
    # what the killed run had read after its checkpoint comes back from the journal, with the ids it had
    assert series(third, "replay/journal_replayed") == [journaled]
    assert third[0]["data"]["ledger/ids"] >= ids_4 + journaled and third[0]["data"]["ledger/dropped/crash"] == 0
    assert (ckpt / "global_step_4" / REPLAY_FILE).read_bytes() == bytes_4

    both = first + [r for r in second if r["step"] <= last] + third
    for r in both:  # the beta schedule follows the optimizer update (2 per step) across the crashes
        u = first_update(r["step"], 2)
        assert r["data"]["tb/beta"] == pytest.approx(beta_at_step(u, beta_init, beta_final, anneal))
        # and so does the learning rate (verl reports the one after its scheduler step: 2 updates per step),
        # restored with verl's checkpoint at each resume
        assert r["data"]["actor/lr"] == pytest.approx(1e-2 * wsd_lr_ratio(2 * r["step"], 2, 4, 6), abs=1e-12)
    assert all(x % 2 == 0 for x in series(both, "replay/staleness_max"))  # one sample per step of 2 updates
    # the reference: policy-reference KL at the start of a step is zero right after a reset (steps 3, 5) and not
    # otherwise (step 4: KL(theta_3 || theta_2)); right after each resume (steps 3 and 5) it is the KL the run had
    # at its last checkpoint (that step's reset, saved with it), not the KL to the initial model. The same weights
    # give the same log-probs to float32 rounding, ~1e-7 per token
    kl = {r["step"]: r["data"]["tb/kl_step_start"] for r in both}
    margin("KL at step 1 (reference = policy)", abs(kl[1]), SAME_WEIGHTS_KL)
    margin("KL right after the first resume (step 3)", abs(kl[3]), SAME_WEIGHTS_KL)
    margin("KL at step 4 (policy moved)", abs(kl[4]), SAME_WEIGHTS_KL, below=False)
    margin("KL right after the second resume (step 5)", abs(kl[5]), SAME_WEIGHTS_KL)
    for key in ("tb/log_z", "tb/kl", "tb/zero_reward_variance_frac", "tb/mean_abs_advantage", "actor/tb/residual_var"):
        assert all(math.isfinite(x) for x in series(both, key)), key
    assert max(series(both, "actor/grad_norm")) > 0
    assert max(series(both, "replay/fraction")) > 0
    assert max(series(both, "replay/staleness_max")) > 0
    assert max(series(both, "training/off_policy/trajectory_staleness/max")) > 0  # verl's own view agrees
    # reference log-probs kept in the store are of the reference they were computed with: none is served at the
    # step after a reset (steps 3 and 5, across the resumes: the store's reference version is checkpointed), and
    # the zero KL above holds. (Whether a step between resets draws a replay of a current-version row depends on
    # the sampler's draws, so that is checked where it is certain: tba_sync with ref_cache_check, below.)
    cached = {r["step"]: r["data"]["tba/ref_cached_frac"] for r in both}
    assert cached[1] == cached[3] == cached[5] == 0.0
    # the trajectory ledger balances at every step, and its books carry across both crashes: every step serves
    # the same number of rows, so the uses recorded are exactly step x that (none lost with a resume, none twice)
    assert all(r["data"]["ledger/unbalanced"] == 0.0 for r in both)
    assert all(r["data"]["ledger/stored"] == r["data"]["replay/store_trajectories"] for r in both)
    per_step = {r["step"]: r["data"]["ledger/uses"] for r in both}  # step 2's line may die with the first kill
    assert {1, 3, 4, 5, 6} <= set(per_step)
    assert per_step == {step: step * per_step[1] for step in per_step}


BAD_REWARDS = {
    # mode: (config, what the reward function does from its 65th call on = the 3rd step of 8 prompts x 4,
    #        text the run's output must contain). Every other kind of bad result is refused by the same check,
    #        tested on one verl row in tests/test_reward_manager.py; here the path through a real run
    "raises": ("cpu_tb", "raise ZeroDivisionError('boom')", "raised ZeroDivisionError: boom"),
    "nan_replay": ("cpu_tba", "return float('nan')", "max_nonfinite_frac"),
}


@pytest.mark.parametrize("mode", sorted(BAD_REWARDS))
def test_a_bad_reward_function_stops_the_run_naming_it_and_keeps_checkpoints(tiny_run, tmp_path, mode):
    from tba_ext.core.replay import load_checked

    config, bad, message = BAD_REWARDS[mode]
    fn = tmp_path / "my_reward.py"
    fn.write_text(
        "from tba_ext.tasks.rewards import compute_score as good\n"
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls > 64:\n"
        f"        {bad}\n"
        "    return good(data_source, solution_str, ground_truth, extra_info)\n"
    )
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    # cpu_tb has no replay store: its searcher scores the samples with its copy of the initial model, and the
    # trainer takes those reference log-probs straight from the rows (one worker call per update)
    searcher_reference = ["+actor_rollout_ref.rollout.custom.reference_logprobs=true"] if config == "cpu_tb" else []
    r = subprocess.run(
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
            *searcher_reference,
            f"run_dir={tiny_run}",
            "trainer.total_training_steps=5",
            "trainer.save_freq=1",
            f"trainer.default_local_dir={ckpt}",
            "trainer.v1.colocate_async.num_warmup_batches=0",
            f"reward.custom_reward_function.path={fn}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert message in r.stderr  # the run's final message is the cause, not verl's follow-on error
    if mode != "nan_replay":  # the error names the function, the data source and the dataset row
        assert (
            f"reward function {fn}:compute_score (reward.custom_reward_function) on "
            "data_source='tba_ext/arith', train row with extra_info.index=" in r.stderr
        )
    # what was saved before the failure is intact and loadable
    last = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert last == 2
    assert (ckpt / "global_step_2" / "actor").is_dir()
    if config == "cpu_tba":
        load_checked(str(ckpt / "global_step_2" / REPLAY_FILE))
    if searcher_reference:
        records = read_metrics(metrics)
        assert [r["step"] for r in records] == [1, 2]
        assert series(records, "tba/ref_cached_frac") == [1.0, 1.0]
        assert series(records, "tba/trainer_calls_per_update") == [1.0, 1.0]


def test_tba_sync_trains_every_fresh_group_once_before_any_repeat_and_draws_k_of_s(tiny_run, tmp_path, margin):
    """tba_sync with m = 1: each step's freshly generated groups are all trained on, once; slots a duplicated
    question leaves go to the next-freshest stored prompts; searchers generate S = 6 per prompt and the trainer
    draws K = rollout.n = 4 of them; the rollout serves the weights of every sync (the fused loss's check)."""
    from tba_ext.core import wire
    from tba_ext.core.tb import beta_at_step

    metrics = tmp_path / "metrics.jsonl"
    run_verl(
        "cpu_tba",
        [
            f"run_dir={tiny_run}",
            "trainer.total_training_steps=3",
            "trainer.v1.trainer_mode=tba_sync",
            "trainer.v1.sampler.sampler_kwargs.recency_prob=1.0",
            "+trainer.v1.sampler.sampler_kwargs.samples_per_prompt=6",
            "tba.beta.final=0.01",
            "tba.beta.anneal_steps=3",
        ],
        log_path=str(tmp_path / "verl.log"),
        metrics_path=str(metrics),
    )
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert series(records, "replay/ingested") == [8 * 6] * 3  # S = 6 per prompt generated and stored
    assert series(records, "replay/fraction") == [0.0] * 3
    assert series(records, "replay/fresh_prompts_undrawn") == [0] * 3  # every fresh prompt was trained on
    for d in (r["data"] for r in records):
        # each fresh prompt once; a batch holding the same question twice (the data has 90 distinct questions)
        # leaves slots, which the next-freshest stored prompts fill; a prompt repeats only while the store holds
        # fewer than 8 distinct prompts (at step 1)
        fresh = d["replay/ingested_prompts"]
        repeats = max(0, 8 - d["replay/store_prompts"])
        assert d["replay/repeated_prompts"] == repeats
        assert d["replay/recency_fallback_groups"] == 8 - fresh - repeats
        assert d["replay/distinct_prompt_frac"] * 8 == pytest.approx(8 - repeats)
        # fresh groups are on-policy; next-freshest prompts are the step before's (max_staleness=0 would keep
        # them out: the compare harness's on-policy setting)
        assert d["replay/staleness_max"] == float(d["replay/recency_fallback_groups"] > 0)
    # the fresh groups were generated by the weights each update starts from: their log-probs at the update's
    # first micro-batch are the rollout's, up to float32, at every step (a sync skipped or lost would not be)
    assert (
        min(series(records, wire.ON_POLICY_ROWS_METRIC)) > 0 and len(series(records, wire.ON_POLICY_ROWS_METRIC)) == 3
    )
    margin(
        "on-policy |log pi_theta - log pi_rollout|",
        max(series(records, wire.ROLLOUT_LOGPROB_DIFF_METRIC)),
        SAME_WEIGHTS_LOGPROB,
    )
    # one optimizer update per step: beta at step u is the paper's formula at update u
    assert series(records, "tb/beta") == pytest.approx([beta_at_step(u, 0.05, 0.01, 3) for u in (1, 2, 3)])
    # verl trained on B x K = 32 trajectories, no padding rows (its batch arithmetic still sees n = K = 4)
    for r in records:
        d = r["data"]
        assert d["perf/total_num_tokens"] == pytest.approx(32 * (d["prompt_length/mean"] + d["response_length/mean"]))


def test_tb_pg_weights_stale_tokens_by_the_ratio_to_the_searchers_policy(tiny_run, tmp_path, margin):
    """TBA' on replayed, stale data (colocate_async, m = 0.5): the importance ratio pi_theta / pi_rollout is
    taken against the searcher's log-probs, so it departs from 1 (with old recomputed at the current weights
    it would be exactly 1)."""
    metrics = tmp_path / "metrics.jsonl"
    run_verl(
        "cpu_tb_pg",
        [
            f"run_dir={tiny_run}",
            "trainer.total_training_steps=5",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "trainer.v1.trainer_mode=tba_colocate_async",
            "trainer.v1.colocate_async.num_warmup_batches=1",
            "trainer.v1.sampler.max_off_policy_threshold=null",
            "trainer.v1.sampler.custom_sampler.path=pkg://tba_ext.adapters.sampler",
            "trainer.v1.sampler.custom_sampler.name=TBAReplaySampler",
            "+trainer.v1.sampler.sampler_kwargs.recency_prob=0.5",
            "tba.ref_cache_check=true",
        ],
        log_path=str(tmp_path / "verl.log"),
        metrics_path=str(metrics),
    )
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == list(range(1, 6))
    # reference log-probs kept in the store: replayed rows are served them; checked here against a reference
    # pass on the same rows (same weights: float32 rounding, the 16-bit storage keeps the sum exact)
    assert sum(series(records, "tba/ref_cache_checked_rows")) > 0
    margin("stored vs recomputed reference l_ref", max(series(records, "tba/ref_cache_max_sum_diff")), 1e-3)
    assert max(series(records, "replay/staleness_max")) > 0
    ratios = series(records, "actor/tb_pg/ratio_mean")
    assert series(records, "replay/staleness_max")[0] == 0
    margin("fresh ratio - 1", ratios[0] - 1.0, 1e-4)  # the searcher's weights are the trainer's, up to float32
    margin("stale max |ratio - 1|", max(abs(x - 1.0) for x in ratios[1:]), 1e-3, below=False)  # another policy


def test_a_lora_runs_reference_is_the_base_model_computed_inside_the_update(tiny_run, tmp_path, margin):
    """LoRA (ref_in_actor: the reference is the actor with its adapter off) with the fused update: the reference
    forward of every row (all fresh: no replay store, and the searchers send no reference log-probs) runs inside
    the update's own call, with the adapter off. LoRA's B starts at zero, so at step 1 the adapted policy is the
    base model and the KL is 0 (a placeholder left in the update would make it the sequences' log-prob, several
    nats); once the adapter has moved the KL is not 0 (the adapter left on would keep it at exactly 0: every row
    is computed with the weights it is trained at)."""
    metrics = tmp_path / "metrics.jsonl"
    run_verl(
        "cpu_tb",
        [
            f"run_dir={tiny_run}",
            "trainer.total_training_steps=3",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.model.target_modules=all-linear",
            "actor_rollout_ref.model.lora.merge=True",  # hfcpu loads full weights
            "actor_rollout_ref.actor.optim.lr=1e-2",
        ],
        log_path=str(tmp_path / "verl.log"),
        metrics_path=str(metrics),
    )
    assert (
        "reference log-probs of rows without stored ones: computed inside the update's own call"
        in (tmp_path / "verl.log").read_text()
    )
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert series(records, "tba/trainer_calls_per_update") == [1.0] * 3
    assert series(records, "tba/ref_computed_frac") == [1.0] * 3
    kl = series(records, "tb/kl")
    margin("step-1 |KL| (adapter at zero)", kl[0], 1e-6)
    margin("later |KL| (adapter moved)", max(abs(x) for x in kl[1:]), 1e-3, below=False)
