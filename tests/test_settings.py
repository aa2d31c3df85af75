"""Start-up refusals: each bad TB setting is refused with a message naming the config key."""

import copy

import pytest

from tba_ext.adapters.checks import check_reference_updates, check_replay_run, check_tb_run
from tba_ext.core.settings import parse_settings
from tba_ext.core.steps import local_updates, scheduler_updates_per_call, updates_per_step
from tba_ext.tools.config import compose


@pytest.fixture(scope="module")
def tb_config():
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose("cpu_tb", ["run_dir=/nonexistent"]), resolve=True)


def with_change(cfg, dotted, value):
    cfg = copy.deepcopy(cfg)
    node = cfg
    *path, last = dotted.split(".")
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value
    return cfg


def test_shipped_tb_config_passes(tb_config):
    check_tb_run(tb_config)
    parse_settings(tb_config.get("tba"))


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("algorithm.kl_ctrl.kl_coef", 0.0, "algorithm.kl_ctrl.kl_coef"),
        ("algorithm.kl_ctrl.kl_coef", -0.1, "algorithm.kl_ctrl.kl_coef"),
        ("actor_rollout_ref.rollout.n", 1, "actor_rollout_ref.rollout.n"),
        ("algorithm.rollout_correction.bypass_mode", True, "bypass_mode"),
        ("algorithm.use_kl_in_reward", False, "algorithm.use_kl_in_reward"),
        ("algorithm.kl_penalty", "low_var_kl", "algorithm.kl_penalty"),
        ("algorithm.kl_ctrl.type", "adaptive", "algorithm.kl_ctrl.type"),
        ("actor_rollout_ref.actor.use_kl_loss", True, "use_kl_loss"),
        ("algorithm.adv_estimator", "grpo", "algorithm.adv_estimator"),
    ],
)
def test_bad_tb_settings_are_refused(tb_config, key, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_tb_run(with_change(tb_config, key, value))


@pytest.mark.parametrize(
    "node,message",
    [
        ({"beta": {"final": 0.0}}, "tba.beta.final"),
        ({"ref_reset_every": -1}, "tba.ref_reset_every"),
        ({"beta_final": 0.1}, "tba.beta_final"),
    ],
)
def test_bad_tba_node_is_refused(node, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_settings(node)


def test_unknown_config_name_is_refused():
    with pytest.raises(ValueError, match="unknown config"):
        compose("cpu_nope", [])


@pytest.fixture(scope="module")
def tb_pg_config():
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose("cpu_tb_pg", ["run_dir=/nonexistent"]), resolve=True)


def test_shipped_tb_pg_config_takes_the_ratio_against_the_rollout_policy(tb_pg_config):
    check_tb_run(tb_pg_config)
    assert tb_pg_config["algorithm"]["rollout_correction"]["rollout_is"] == "token"


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("algorithm.rollout_correction.rollout_is", None, "algorithm.rollout_correction.rollout_is=token"),
        ("algorithm.rollout_correction.rollout_is", "sequence", "algorithm.rollout_correction.rollout_is=token"),
        ("algorithm.rollout_correction.rollout_is_threshold", 2.0, "rollout_is_threshold"),
        ("algorithm.rollout_correction.rollout_is_batch_normalize", True, "rollout_is_batch_normalize"),
        ("actor_rollout_ref.rollout.calculate_log_probs", False, "calculate_log_probs"),
        # verl's default: each micro-batch divided by its own padded length (the gradient depends on the split)
        ("actor_rollout_ref.actor.loss_scale_factor", None, "loss_scale_factor, which is unset"),
    ],
)
def test_tb_pg_without_the_rollout_ratio_is_refused(tb_pg_config, key, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_tb_run(with_change(tb_pg_config, key, value))


@pytest.fixture(scope="module")
def tba_config():
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose("cpu_tba", ["run_dir=/nonexistent"]), resolve=True)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"trainer.v1.sampler.sampler_kwargs.samples_per_prompt": 3}, "samples_per_prompt=3 is S.*rollout.n=4,"),
        (
            {"trainer.v1.sampler.sampler_kwargs.samples_per_prompt": 6, "trainer.v1.trainer_mode": "colocate_async"},
            "trainer.v1.trainer_mode",
        ),
        (
            {
                "trainer.v1.sampler.sampler_kwargs.samples_per_prompt": 6,
                "trainer.v1.sampler.sampler_kwargs.per_prompt_capacity": 5,
            },
            "per_prompt_capacity=5",
        ),
    ],
)
def test_bad_oversampling_is_refused(tba_config, changes, message):
    cfg = tba_config
    for key, value in changes.items():
        cfg = with_change(cfg, key, value)
    with pytest.raises(ValueError, match=message):
        check_replay_run(cfg)


def test_oversampling_settings_pass(tba_config):
    cfg = with_change(tba_config, "trainer.v1.sampler.sampler_kwargs.samples_per_prompt", 6)
    assert check_replay_run(cfg).samples_per_prompt == 6


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"actor_rollout_ref.actor.strategy": "megatron"}, r"actor_rollout_ref\.actor\.strategy=fsdp2"),
        ({"actor_rollout_ref.ref.strategy": "fsdp"}, r"actor_rollout_ref\.ref\.strategy=fsdp2"),
        ({"actor_rollout_ref.model.lora_rank": 8}, "LoRA"),
        ({"algorithm.use_kl_in_reward": False}, "no reference policy"),
    ],
)
def test_a_reference_update_that_cannot_run_is_refused_at_start_up(tb_config, changes, message):
    cfg = tb_config
    for key, value in changes.items():
        cfg = with_change(cfg, key, value)
    with pytest.raises(ValueError, match=message):
        check_reference_updates(cfg, parse_settings({"ref_reset_every": 50}))
    check_reference_updates(cfg, parse_settings({}))  # no reference update asked: nothing to refuse


def test_a_reference_update_inside_one_update_call_is_refused(tb_config):
    """verl runs a call's mini-batches back to back inside the workers; the reference moves between calls."""
    two_per_call = with_change(tb_config, "data.train_batch_size", 16)  # 2 mini-batches of 8 prompts per call
    with pytest.raises(
        ValueError,
        match=r"tba\.ref_reset_every=3 would fall inside one update_actor call of 2.*multiple of 2 \(2 or 4\)",
    ):
        check_reference_updates(two_per_call, parse_settings({"ref_reset_every": 3}))
    check_reference_updates(two_per_call, parse_settings({"ref_reset_every": 4}))
    decoupled = with_change(two_per_call, "trainer.v1.trainer_mode", "tba_separate_async")
    decoupled = with_change(decoupled, "trainer.v1.separate_async.parameter_sync_step", 2)  # one call per update
    check_reference_updates(decoupled, parse_settings({"ref_reset_every": 1, "ref_ema": 0.9}))


def test_reference_ema_settings(tb_config):
    check_reference_updates(tb_config, parse_settings({"ref_reset_every": 1, "ref_ema": 0.9}))
    with pytest.raises(ValueError, match=r"tba\.ref_ema must be in \[0, 1\)"):
        parse_settings({"ref_reset_every": 1, "ref_ema": 1.0})
    with pytest.raises(ValueError, match="tba.ref_reset_every=0 never updates"):
        check_reference_updates(tb_config, parse_settings({"ref_ema": 0.9}))


def test_updates_per_step_counts_mini_batches_and_epochs(tb_config):
    cfg = with_change(
        with_change(tb_config, "data.train_batch_size", 16), "actor_rollout_ref.actor.ppo_mini_batch_size", 8
    )
    assert updates_per_step(cfg) == 2
    assert updates_per_step(with_change(cfg, "actor_rollout_ref.actor.ppo_epochs", 3)) == 6


@pytest.mark.parametrize("mode", ["sync", "tba_sync", "tba_colocate_async", "separate_async", "tba_separate_async"])
def test_k_is_parameter_sync_step_in_separate_async_only(tb_config, mode):
    cfg = with_change(with_change(tb_config, "trainer.v1.trainer_mode", mode), "data.train_batch_size", 16)
    cfg = with_change(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", 4)
    cfg = with_change(cfg, "trainer.v1.separate_async.parameter_sync_step", 4)
    k = 4 if mode.endswith("separate_async") else 1
    assert local_updates(cfg) == k
    assert scheduler_updates_per_call(cfg) == updates_per_step(cfg) // k  # 4 updates a step: 1 per call, or 4


def test_free_running_searchers_need_the_decoupled_mode_and_room_for_a_fetch(tb_config):
    from tba_ext.adapters.checks import check_searcher_queue

    decoupled = with_change(tb_config, "trainer.v1.trainer_mode", "tba_separate_async")
    check_searcher_queue(decoupled, parse_settings({"searcher_queue_prompts": 16}))
    with pytest.raises(ValueError, match="trainer_mode=tba_separate_async"):
        check_searcher_queue(tb_config, parse_settings({"searcher_queue_prompts": 16}))
    with pytest.raises(ValueError, match=r"searcher_queue_prompts=4 is below one dataloader fetch of 8"):
        check_searcher_queue(decoupled, parse_settings({"searcher_queue_prompts": 4}))


def test_paced_searchers_stay_at_most_the_queue_ahead_of_consumption(tb_config):
    """A searcher that finishes everything at once (nothing ever in flight) against a trainer consuming 8 prompts
    per update: free-running, it is handed a full queue at every update; paced at 1.0, what it was handed never
    exceeds what the trainer consumed by more than the queue, nor falls a fetch below it."""
    from tba_ext.adapters.checks import check_searcher_queue
    from tba_ext.core.steps import prompts_to_queue

    queue, chunk, per_update = 32, 16, 8
    for pace in (None, 1.0):
        submitted = consumed = 0
        for update in range(1, 41):
            consumed += per_update
            submitted += prompts_to_queue(queue, 0, chunk, submitted, consumed, pace)
            ahead = submitted - consumed
            if pace is None:
                assert submitted == queue * update
            else:
                assert queue - chunk <= ahead <= queue, (update, ahead)
    # in flight counts against the queue either way; whole fetches only
    assert prompts_to_queue(32, 20, 16, 0, 0, None) == 0
    assert prompts_to_queue(32, 10, 16, 0, 0, None) == 16
    assert prompts_to_queue(32, 0, 16, 40, 16, 1.0) == 0  # 40 handed out, 16 consumed: the lead is taken
    decoupled = with_change(tb_config, "trainer.v1.trainer_mode", "tba_separate_async")
    with pytest.raises(ValueError, match="searcher_prompts_per_consumed paces free-running searchers"):
        check_searcher_queue(decoupled, parse_settings({"searcher_prompts_per_consumed": 1.0}))
    with pytest.raises(ValueError, match="searcher_prompts_per_consumed must be > 0"):
        parse_settings({"searcher_queue_prompts": 32, "searcher_prompts_per_consumed": 0})


def test_the_trainer_version_counts_every_update_before_a_sample_local_ones_included():
    from tba_ext.core.steps import trainer_version

    # separate_async, k = 2 samples of one update each per global step
    assert [trainer_version(g, j, 2, 2) for g in (1, 2, 3) for j in (0, 1)] == [0, 1, 2, 3, 4, 5]
    # sync / colocate_async: one sample per step, followed by its 2 mini-batch updates (x 3 epochs)
    assert [trainer_version(g, 0, 6, 1) for g in (1, 2, 3)] == [0, 6, 12]
    # separate_async, k = 2 samples of 3 epochs each
    assert [trainer_version(2, j, 6, 2) for j in (0, 1)] == [6, 9]


def test_decoupled_max_staleness_below_k_minus_1_is_refused():
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(compose("cpu_tba_decoupled", ["run_dir=/nonexistent"]), resolve=True)
    check_replay_run(with_change(cfg, "trainer.v1.sampler.sampler_kwargs.max_staleness", 1))
    with pytest.raises(ValueError, match=r"sampler_kwargs.max_staleness=0: .*parameter_sync_step=2"):
        check_replay_run(with_change(cfg, "trainer.v1.sampler.sampler_kwargs.max_staleness", 0))
    on_policy = with_change(cfg, "trainer.v1.separate_async.parameter_sync_step", 1)
    check_replay_run(with_change(on_policy, "trainer.v1.sampler.sampler_kwargs.max_staleness", 0))


def test_the_wsd_learning_rate_is_hf_s_warmup_stable_decay():
    """tba.lr_schedule's factor against transformers' own get_wsd_schedule (cosine decay), update by update, and
    the LambdaLR the actor workers get from it on a real optimizer."""
    from types import SimpleNamespace

    import torch
    from transformers.optimization import get_wsd_schedule

    from tba_ext.adapters.lr_schedule import install_lr_schedule
    from tba_ext.core.tb import wsd_lr_ratio

    def optimizer():
        return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-5)

    for shape, (warmup, stable, decay, min_ratio) in [("cosine", (50, 450, 500, 0.1)), ("linear", (0, 0, 260, 0.0))]:
        hf_opt = optimizer()
        hf = get_wsd_schedule(
            hf_opt,
            num_warmup_steps=warmup,
            num_stable_steps=stable,
            num_decay_steps=decay,
            min_lr_ratio=min_ratio,
            decay_type=shape,
        )
        for update in range(warmup + stable + decay + 50):
            assert wsd_lr_ratio(update, warmup, stable, decay, min_ratio, shape) * 1e-5 == pytest.approx(
                hf_opt.param_groups[0]["lr"], rel=1e-9, abs=1e-18
            ), (shape, update)
            hf_opt.step(), hf.step()
    # the worker-side install: verl's engine and checkpoint manager both hold the new scheduler; verl steps it
    # once per update_actor call of 2 updates here
    ours = optimizer()
    engine = SimpleNamespace(optimizer=ours, lr_scheduler=None, checkpoint_manager=SimpleNamespace(lr_scheduler=None))
    first_lr = install_lr_schedule(
        SimpleNamespace(actor=SimpleNamespace(engine=engine)),
        {"name": "wsd", "warmup_updates": 4, "stable_updates": 2, "decay_updates": 4},
        2,
    )
    assert first_lr == 0.0 and engine.checkpoint_manager.lr_scheduler is engine.lr_scheduler
    lrs = []
    for _ in range(6):
        ours.step(), engine.lr_scheduler.step()
        lrs.append(ours.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-5 * wsd_lr_ratio(2 * c, 4, 2, 4) for c in range(1, 7)])


def test_a_learning_rate_schedule_that_would_be_overridden_is_refused(tb_config):
    from tba_ext.adapters.checks import check_lr_schedule

    wsd = parse_settings(
        {"lr_schedule": {"name": "wsd", "warmup_updates": 50, "stable_updates": 450, "decay_updates": 500}}
    )
    check_lr_schedule(tb_config, wsd)
    for key, value in [
        ("actor_rollout_ref.actor.optim.lr_scheduler_type", "cosine"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps", 10),
    ]:
        with pytest.raises(ValueError, match="lr_scheduler_type=constant"):
            check_lr_schedule(with_change(tb_config, key, value), wsd)
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy=megatron"):
        check_lr_schedule(with_change(tb_config, "actor_rollout_ref.actor.strategy", "megatron"), wsd)
    with pytest.raises(ValueError, match="tba.lr_schedule.name must be wsd or null"):
        parse_settings({"lr_schedule": {"name": "cosine"}})


def test_each_config_value_is_written_once_the_yaml_defaults_are_the_dataclasses():
    """The `tba:` block of the algo YAMLs (what a config shows its users) holds the TBASettings defaults, except
    the keys a YAML sets on purpose; every config that selects a tba-ext piece spells the constant for it."""
    import dataclasses
    import glob
    import os

    import yaml

    from tba_ext.core.settings import (
        POLICY_LOSS_CONFIG_TARGET,
        REPLAY_SAMPLER_NAME,
        REPLAY_SAMPLER_PATH,
        TBASettings,
    )
    from tba_ext.tools.config import CONFIG_DIR

    def flat(obj, prefix=""):
        if dataclasses.is_dataclass(obj):
            obj = dataclasses.asdict(obj)
        out = {}
        for key, value in obj.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    defaults = flat(TBASettings())
    intended = {"tb_pg.yaml": {"ref_reset_every": 50}}  # TBA' resets its reference every rho = 50 updates
    for name in ("tb.yaml", "tb_pg.yaml"):
        with open(os.path.join(CONFIG_DIR, "algo", name)) as f:
            node = flat(yaml.safe_load(f)["tba"])
        assert set(node) == set(defaults), (name, set(node) ^ set(defaults))
        for key, value in node.items():
            want = intended.get(name, {}).get(key, defaults[key])
            assert value == want, f"algo/{name}: tba.{key} = {value!r}, TBASettings says {defaults[key]!r}"
    for path in glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True):
        text = open(path).read()
        if "custom_sampler:" in text and "TBAReplaySampler" in text:
            assert REPLAY_SAMPLER_PATH in text and REPLAY_SAMPLER_NAME in text, path
        if "policy_loss_config" in text:
            assert POLICY_LOSS_CONFIG_TARGET in text, path
