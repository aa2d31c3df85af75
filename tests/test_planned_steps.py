"""verl's V1 loop runs the global steps a config plans (``trainer.total_training_steps``, each of k local updates in
the decoupled configs), whatever the size of its dataset. verl counts rows // data.train_batch_size steps an epoch,
divides by it and stops after ``trainer.total_epochs`` of them (trainer_base.py ``_init_dataloader`` and ``fit``):
the red-team config's 1280-prompt batches ran 30 of 500 steps over 2000 prompts and divided by zero below 1280.
Each GPU config is composed as a GPU user composes it, its data loaded by its trainer mode (verl's own loading) and
run through verl's own ``fit`` with the step itself left out; what cannot run is refused, naming the keys."""

import pytest
from omegaconf import OmegaConf, open_dict
from test_gpu_configs import GPU_CONFIGS
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

from tba_ext.adapters.checks import check_planned_steps, planned_epochs
from tba_ext.adapters.decoupled import TBATrainerSeparateAsync
from tba_ext.adapters.trainer import TBATrainerSync
from tba_ext.core.settings import REPLAY_SAMPLER_NAME
from tba_ext.core.steps import is_tba_mode, verl_dataloader_fetch, verl_mode
from tba_ext.tasks.data import corpus_for, write_task
from tba_ext.tools.config import compose
from tba_ext.tools.models import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus_for("redteam", 0), 512, chat_template=True)  # serves the raw-prompt configs too


def composed(name, monkeypatch, data_dir, rows, *overrides):
    """The config as ``tba-ext train --config NAME`` composes it over ``rows`` red-team prompts in DATA_DIR (any task's
    rows load alike), with no validation run (the loop's checkpoints stay: the test counts them)."""
    write_task("redteam", str(data_dir), train_size=rows, test_size=8, seed=0)
    monkeypatch.setenv("DATA_DIR", str(data_dir))
    return compose(name, ["trainer.val_before_train=false", "trainer.test_freq=-1", *overrides])


def loaded(trainer_cls, cfg, tokenizer):
    """A trainer of the config's mode with its data loaded: tokenizer and trainer mode as its constructor leaves
    them (a tba_* mode runs verl's trainer as the base mode, ``TBATrainerMixin.__init__``), then verl's
    ``_init_dataloader`` (with tba-ext's around it in the tba_* modes)."""
    trainer = trainer_cls.__new__(trainer_cls)
    mode = verl_mode(cfg.trainer.v1.trainer_mode)
    with open_dict(cfg):
        cfg.trainer.v1.trainer_mode = mode
    trainer.config, trainer.tokenizer, trainer.processor = cfg, tokenizer, None
    trainer.trainer_mode = mode
    trainer.parameter_sync_step = cfg.trainer.v1.get(mode, {}).get("parameter_sync_step", 1)
    trainer._init_dataloader()
    return trainer


def fit_steps(trainer, monkeypatch) -> tuple[list[int], list[int]]:
    """The global steps verl's own ``fit`` runs, and those it saves a checkpoint at, with the step, the hooks and
    TransferQueue left out; none where it divides by zero steps an epoch."""
    steps, saves = [], []

    class Batch:
        keys, partition_id = [], "train"

    def step(metrics, timing_raw):
        steps.append(trainer.global_steps)
        return Batch()

    trainer.step = step
    trainer._save_checkpoint = lambda: saves.append(trainer.global_steps)
    for hook in ("on_train_begin", "on_step_begin", "on_step_end", "on_train_end", "_reissue_inflight_prompts"):
        setattr(trainer, hook, lambda: None)
    for name in ("_start_profiling", "_stop_profiling", "_compute_metrics", "_shutdown_dump_executor"):
        setattr(trainer, name, lambda *args, **kwargs: None)
    trainer._consume_sync_metrics = dict
    monkeypatch.setattr(trainer_base, "tq", type("TQ", (), {"kv_clear": staticmethod(lambda **kwargs: None)}))
    trainer.global_steps = 0
    try:
        trainer.fit(agent_loop_manager=None)
    except ZeroDivisionError:  # verl's current_epoch = global_steps // steps_per_epoch
        assert trainer.steps_per_epoch == 0
    return steps, saves


TRAINERS = {"tba_separate_async": TBATrainerSeparateAsync, "separate_async": PPOTrainerSeparateAsync}


@pytest.mark.parametrize(
    "batches", [0.78, 1.56, None], ids=["fewer-rows-than-a-batch", "one-batch-an-epoch", "2000-rows"]
)
@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_each_gpu_config_runs_its_planned_steps_or_is_refused_before_ray(
    name, batches, tokenizer, monkeypatch, tmp_path
):
    """The red-team config's batch of 1280 over 1000 and 2000 prompts (the issue's sizes), as many batches for the
    others, and prepare-data's default 2000 rows: under tba-ext's trainer modes every planned step runs and the last
    saves its checkpoint, unless its initial replay buffer needs more distinct prompts than the rows hold; under
    verl's own (the Dr. GRPO twins), the preflight refuses exactly the plans verl's loop would cut short."""
    batch = int(compose(name, []).data.train_batch_size)
    rows = 2000 if batches is None else int(batch * batches)
    cfg = composed(name, monkeypatch, tmp_path / "data", rows)
    plain = OmegaConf.to_container(cfg, resolve=True)
    mode, planned = plain["trainer"]["v1"]["trainer_mode"], plain["trainer"]["total_training_steps"]
    trainer = loaded(TRAINERS[mode], cfg, tokenizer)
    assert trainer.train_dataloader.batch_size == verl_dataloader_fetch(plain) == 1  # verl's exact refills
    steps, saves = fit_steps(trainer, monkeypatch)
    try:
        check_planned_steps(plain, rows)
    except ValueError as refused:
        # an initial buffer of more distinct prompts than the rows hold could never fill (the sampler, which would
        # wait for it, is not part of this loop)
        min_buffer = (plain["trainer"]["v1"]["sampler"].get("sampler_kwargs") or {}).get("min_buffer_groups")
        never_fills = min_buffer is not None and min_buffer > rows and "min_buffer_groups" in str(refused)
        assert never_fills or (not is_tba_mode(mode) and len(steps) < planned), refused
        return
    assert steps == list(range(1, planned + 1))
    assert saves[-1] == planned


def test_a_trainer_that_fetches_whole_batches_refuses_fewer_rows_than_a_batch(tokenizer, monkeypatch, tmp_path):
    """tba_sync's dataloader hands over data.train_batch_size prompts at once and drops a short fetch: 1000 prompts
    for a batch of 1280 could not serve a step (verl divided by zero)."""
    cfg = composed("tba_gpt2_redteam", monkeypatch, tmp_path / "data", 1000, "trainer.v1.trainer_mode=tba_sync")
    with pytest.raises(ValueError, match=r"data\.train_files: 1000 training prompts.*data\.train_batch_size"):
        loaded(TBATrainerSync, cfg, tokenizer)


def plan(mode="tba_separate_async", steps=500, epochs=30, batch=1280, gen=None):
    """The keys ``planned_epochs`` reads, as a composed config holds them."""
    return {
        "data": {"train_batch_size": batch, "gen_batch_size": gen},
        "trainer": {"total_training_steps": steps, "total_epochs": epochs, "v1": {"trainer_mode": mode}},
        "algorithm": {},
    }


def replay_plan(**sampler_kwargs):
    cfg = plan(mode="colocate_async", steps=60, epochs=1, batch=32)
    cfg["trainer"]["v1"]["sampler"] = {
        "custom_sampler": {"name": REPLAY_SAMPLER_NAME},
        "sampler_kwargs": sampler_kwargs,
    }
    return cfg


@pytest.mark.parametrize(
    "rows, cfg, expected",
    [
        (2000, plan(), (1, 500)),  # the red-team config over prepare-data's 2000 prompts: 1 step an epoch
        (1000, plan(), (1, 500)),  # fewer prompts than a batch: a step draws the dataset more than once
        (64 * 100, plan(steps=500, batch=64), (100, 30)),  # 30 epochs of 100 steps cover 500: left as it is
        (640, plan(steps=None, batch=64), (10, 30)),  # no planned steps: verl derives them from the epochs
        (2000, plan(mode="tba_sync"), (1, 500)),
    ],
)
def test_the_planned_epochs_cover_the_planned_steps(rows, cfg, expected):
    per_epoch, epochs = planned_epochs(cfg, rows)
    assert (per_epoch, epochs) == expected
    planned = cfg["trainer"]["total_training_steps"] or per_epoch * epochs
    assert per_epoch * epochs >= planned  # verl's loop: min(total_training_steps, total_epochs x steps_per_epoch)


@pytest.mark.parametrize(
    "rows, cfg, named",
    [
        (1000, plan(mode="tba_sync"), ["data.train_files: 1000 training prompts", "data.train_batch_size"]),
        (100, plan(mode="sync", gen=128), ["100 training prompts", "fetch of 128", "data.gen_batch_size"]),
        (1000, plan(steps=None), ["trainer.total_training_steps is null", "data.train_batch_size=1280"]),
        (1000, plan(mode="colocate_async"), ["trainer_mode=colocate_async (verl's own)", "data.train_batch_size=1280"]),
        (2000, plan(mode="sync"), ["trainer.total_epochs=30 x 1 global steps", "set trainer.total_epochs=500"]),
        # the mixed-staleness arm's initial buffer counts distinct prompts: 408 can never come from 256 rows
        (256, replay_plan(min_buffer_groups=408), ["min_buffer_groups=408", "256 training prompts"]),
    ],
)
def test_a_plan_that_cannot_run_is_refused_before_ray_naming_the_keys(rows, cfg, named):
    """``tba-ext train``'s preflight (over the files' rows): refusals where no step could be served, and, under
    verl's own trainer modes (whose epochs tba-ext does not set), a plan verl's loop would cut short."""
    with pytest.raises(ValueError) as refused:
        check_planned_steps(cfg, rows)
    assert all(part in str(refused.value) for part in named), str(refused.value)
