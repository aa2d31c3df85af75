"""The CPU recipe the quickstart and ``tba-ext compare`` share: task, model, warm start, RL settings, and how a
staleness level s is set for each method, and the prepared run folder both start from. No verl import."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

from tba_ext.core.settings import IS_RATIO_MAX, REPLAY_SAMPLER_NAME, REPLAY_SAMPLER_PATH, SAMPLER_KWARGS
from tba_ext.core.steps import TBA_MODE_PREFIX


@dataclass(frozen=True)
class Recipe:
    """One CPU run's recipe: task, model, warm start and RL settings. Measured choices: docs/quickstart.md and
    benchmarks/results/; see each field's comment in FULL."""

    method: str  # the objective: a slug, a key of METHODS
    task: str
    size: str  # model size (tools.models.SIZES)
    train: int  # training prompts
    test: int  # held-out prompts
    sft_steps: int  # supervised warm-start steps
    sft_lr: float
    rl_steps: int  # optimizer updates
    rl_lr: float
    batch: int  # prompts per update
    group_size: int  # K responses per prompt
    recency_prob: float  # m
    staleness: int  # generation this many batches ahead (0: verl's sync trainer)
    # the levels a ``mix`` batch holds (tba-prime's report's); the initial buffer is (1 + their mean) batches
    staleness_mix: tuple[int, ...] = (1, 4, 10, 32)


FULL = Recipe(
    method="tb_pg",  # the quickstart's objective, TBA′: it gained more, and more evenly, than plain TB over 3 seeds
    # x 2 repeats (benchmarks/results/archive/quickstart_spread*_before_fused_update.json)
    task="arith20",  # two-digit sums, 80 held-out operand pairs (arith has only 10: a coarse measure)
    size="small",
    train=4000,
    test=80,  # each held-out pair once: greedy is deterministic, a repeated row adds nothing
    sft_steps=300,
    sft_lr=1e-3,  # warm start: ~0.2 held-out, ~0.45 on training pairs (groups with variance)
    rl_steps=60,
    rl_lr=1e-4,
    batch=32,  # prompts per update: the updates are noise-bound (lr 2e-4 at 16 made seed 1 worse); 32
    # took seed 1 0.450 -> 0.525 greedy where 16 fell in 7 of 8 runs (benchmarks/results/archive/)
    group_size=8,  # K: mean sampled gain +0.044 over 6 runs vs +0.026 with K = 4 (benchmarks/results/archive/);
    # noisier log Z / baselines with 4
    recency_prob=0.95,  # m, the paper's GSM8K value
    staleness=1,  # the quickstart's run: generation one batch ahead (colocate_async)
)
# CI's plumbing run. 4 updates of 16 prompts at lr 1e-4: held-out greedy 0.41 -> 0.41, 0.09 -> 0.19, 0.41 -> 0.41
# (seeds 0-2; plain TB 0.41 -> 0.53, 0.09 -> 0.22, 0.41 -> 0.41); 8 prompts at 3e-4 left seed 2 at 0.41 -> 0.19
SHORT = Recipe(
    method="tb_pg",
    task="arith",
    size="tiny",
    train=256,
    test=32,
    sft_steps=150,
    sft_lr=3e-3,
    rl_steps=4,
    batch=16,
    rl_lr=1e-4,
    group_size=4,
    recency_prob=0.95,
    staleness=1,
    staleness_mix=(1, 2),  # the mixed path in 4 updates, after an initial buffer of 2.5 batches, not 12.75
)
# the tasks ``tba-ext compare --task`` runs: the same model and RL settings. Countdown's warm start is longer: after
# 300 steps (greedy 0.10-0.125 held-out, sampled 0.07-0.08) a seed-0 TBA′ run at s = 10 stayed flat for 60 updates;
# after 800 (greedy 0.15, sampled 0.149, pass@8 0.53) it went 0.15 -> 0.26 greedy in 30 updates
TASK_RECIPES = {"arith20": FULL, "countdown": replace(FULL, task="countdown", sft_steps=800)}


def recipe_for(task: str | None, short: bool = False) -> Recipe:
    """The compare recipe of ``task`` (default: the quickstart's), or CI's plumbing recipe with ``short`` (its tiny
    model on arith unless a task is named)."""
    if task is not None and task not in TASK_RECIPES:
        raise ValueError(f"--task: compare runs {sorted(TASK_RECIPES)}, got {task!r}")
    if short:
        return SHORT if task is None else replace(SHORT, task=task)
    return TASK_RECIPES[task or FULL.task]


STALL_TIMEOUT_S = 600  # a CPU step takes seconds: ten minutes without one means a hung worker
EVAL_SAMPLES = 16  # temperature-1 samples per held-out prompt for the sampled accuracy (the reward RL optimises)

# every method at level s trains on data as stale as s alone makes it: verl's own cap (default 8 versions, the
# staler groups dropped and refilled with other prompts) is off for every arm, so each arm sees the same prompts
# in the same order, generated s batches ahead, and the replay arms' store serves nothing staler than s
UNCAPPED = "trainer.v1.sampler.max_off_policy_threshold=null"
REPLAY_SAMPLER = [
    f"trainer.v1.sampler.custom_sampler.path={REPLAY_SAMPLER_PATH}",
    f"trainer.v1.sampler.custom_sampler.name={REPLAY_SAMPLER_NAME}",
]


ROLLOUT_CORRECTION = "++algorithm.rollout_correction."  # set or add: verl's config has the node


def _rollout_is(level: str) -> tuple[str, ...]:
    """verl's decoupled rollout correction: Dr. GRPO's loss weighted by pi_old / pi_rollout (per token, or the
    sequence's product) truncated at TBA′'s clamp."""
    return (f"{ROLLOUT_CORRECTION}rollout_is={level}", f"{ROLLOUT_CORRECTION}rollout_is_threshold={IS_RATIO_MAX}")


@dataclass(frozen=True)
class Method:
    """An objective the quickstart and ``tba-ext compare`` train: how it is shown and which shipped CPU config runs
    it. Code, run folders and results JSONs name it by its slug (its key in METHODS)."""

    label: str  # how reports and plots show it
    config: str  # the shipped CPU config (tba_ext/configs)
    trainer_prefix: str  # TBA_MODE_PREFIX for tba-ext's trainer modes, "" for verl's own
    replay: bool  # trains from tba-ext's replay store
    overrides: tuple[str, ...] = ()  # what sets it apart from its config's defaults


METHODS = {
    "tb": Method("TB", "cpu_tba", TBA_MODE_PREFIX, True),
    "tb_pg": Method("TBA′", "cpu_tb_pg", TBA_MODE_PREFIX, True),
    # the staleness stress's arm: TBA′ with beta = 0, its advantage the plain group-centred reward (no KL term);
    # next to TBA′ so that tables list the two side by side
    "tb_pg_nokl": Method("TBA′ β=0", "cpu_tb_pg", TBA_MODE_PREFIX, True, ("algorithm.kl_ctrl.kl_coef=0.0",)),
    # TBA′ on exactly Dr. GRPO's batches (verl's own sampler: no store, no replay, no resampling), so that against
    # the corrected Dr. GRPO below it differs in the advantage alone
    "tb_pg_fifo": Method("TBA′ no store", "cpu_tb_pg", TBA_MODE_PREFIX, False),
    "drgrpo": Method("Dr. GRPO", "cpu_drgrpo", "", False),  # the uncorrected reference
    # what a verl user runs on stale data: verl's rollout corrections, truncated where TBA′ clamps its ratio
    "drgrpo_tis": Method("Dr. GRPO token-IS", "cpu_drgrpo", "", False, _rollout_is("token")),
    "drgrpo_sis": Method("Dr. GRPO seq-IS", "cpu_drgrpo", "", False, _rollout_is("sequence")),
    # pi_old := pi_rollout, so verl's PPO clip bounds the ratio to the policy that generated each token
    "drgrpo_bypass": Method("Dr. GRPO bypass", "cpu_drgrpo", "", False, (f"{ROLLOUT_CORRECTION}bypass_mode=True",)),
}
COMPARED = ("tb", "tb_pg", "drgrpo_tis", "drgrpo")  # what compare trains unless told otherwise


def label(method: str) -> str:
    """A method's display label; a name that is not a slug (a label in a results JSON) is shown as it is."""
    return METHODS[method].label if method in METHODS else method


# the mixed-staleness level: each batch mixes groups of the recipe's staleness_mix levels
MIXED = "mix"
STALENESS_MIX = FULL.staleness_mix


def staleness_level(value: str | int) -> int | str:
    """A compare staleness level: an int s >= 0, or ``mix`` (STALENESS_MIX in every batch)."""
    if value == MIXED:
        return MIXED
    try:
        level = int(value)
    except ValueError:
        level = -1
    if level < 0:
        raise ValueError(f"--staleness takes ints >= 0 or {MIXED!r}, got {value!r}")
    return level


def level_order(level) -> tuple[int, int]:
    """Sort key of staleness levels (ints or their strings): numbers first, ``mix`` last."""
    return (1, 0) if level == MIXED else (0, int(level))


def method_overrides(
    method: str, staleness: int | str, recency_prob: float, batch: int | None = None, mix=STALENESS_MIX
) -> list[str]:
    """Hydra overrides putting ``method`` at staleness s, which bounds every source of off-policy data:
    s = 0 is on-policy (verl's sync trainer; TB and TBA' draw only fresh groups: m = 1, max_staleness = 0);
    s > 0 is verl's colocate_async with generation s batches ahead, and TB and TBA' replay with m, never
    anything staler than s. ``mix`` (needs ``batch``, the prompts per update): every method, Dr. GRPO included,
    trains from tba-ext's store, each batch mixing groups of staleness ``mix`` and each group served once,
    so every objective sees data of the same staleness. Each update waits for a batch of fresh groups; the first
    waits for an initial buffer of (1 + mean(mix)) batches, what the store holds before each draw in
    steady state (a batch enters per update and a group stays until the level that serves it), and the levels
    are exact from update max(mix) on (tests/test_replay.py)."""
    m = METHODS[method]
    if staleness == MIXED:
        if batch is None:
            raise ValueError("the mixed staleness level needs the batch size (prompts per update)")
        buffer_groups = math.ceil((1 + sum(mix) / len(mix)) * batch)
        kwargs = f"++{SAMPLER_KWARGS}"  # set or add: the shipped configs name some of these keys
        return [
            f"trainer.v1.trainer_mode={m.trainer_prefix}colocate_async",
            UNCAPPED,
            *m.overrides,
            f"trainer.v1.colocate_async.num_warmup_batches={math.ceil(buffer_groups / batch)}",
            *([] if m.config == "cpu_tba" else REPLAY_SAMPLER),
            f"{kwargs}staleness_mix=[{','.join(map(str, mix))}]",
            f"{kwargs}max_staleness={max(mix)}",
            f"{kwargs}min_fresh_groups={batch}",
            f"{kwargs}min_buffer_groups={buffer_groups}",
        ]
    mode = f"trainer.v1.trainer_mode={m.trainer_prefix}{'colocate_async' if staleness else 'sync'}"
    out = [mode, UNCAPPED, *m.overrides]
    if staleness:
        out.append(f"trainer.v1.colocate_async.num_warmup_batches={staleness}")
    if m.replay:
        ships_sampler = m.config == "cpu_tba"
        add = "" if ships_sampler else "+"
        out += ([] if ships_sampler else REPLAY_SAMPLER) + [
            f"{add}{SAMPLER_KWARGS}recency_prob={recency_prob if staleness else 1.0}",
            f"{add}{SAMPLER_KWARGS}max_staleness={staleness}",
        ]
    return out


def training_overrides(run_dir: str, p: Recipe, seed: int, steps: int, eval_every: int | None = None) -> list[str]:
    """The RL run on top of a prepared run folder: warm-started model, batch, group size, lr, seed, verl's greedy
    validation before training and every ``eval_every`` updates (default: at the end)."""
    return [
        f"run_dir={run_dir}",
        f"actor_rollout_ref.model.path={run_dir}/model_sft",
        f"trainer.total_training_steps={steps}",
        f"data.train_batch_size={p.batch}",
        f"actor_rollout_ref.rollout.n={p.group_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={p.batch}",
        f"data.seed={seed}",
        f"actor_rollout_ref.actor.optim.lr={p.rl_lr}",
        "trainer.val_before_train=True",
        f"trainer.test_freq={eval_every or steps}",
    ]


def prepare(run_dir: str, p: Recipe, seed: int) -> dict:
    """The run folder the quickstart and compare start from: the model and tokenizer built offline, the task's
    parquet files and the supervised warm start (``model_sft``), built on the pinned CPU kernels
    (``tba_ext.tools.kernels``: the same model on every CPU)."""
    from tba_ext.tools.kernels import on_pinned_kernels

    t0 = time.time()
    info = on_pinned_kernels("model_and_warm_start", run_dir=run_dir, recipe=asdict(p), seed=seed)
    return {**info, "prepare_seconds": time.time() - t0}


def model_and_warm_start(run_dir: str, recipe: dict, seed: int) -> dict:
    """``prepare``'s work, in the process it runs in: its model's summary and the warm start's final loss."""
    from tba_ext.tasks.data import corpus_for, write_task
    from tba_ext.tools.kernels import kernels_pinned
    from tba_ext.tools.models import ModelSpec, make_model
    from tba_ext.tools.warmstart import warm_start

    p = Recipe(**recipe)
    kernels = "pinned" if kernels_pinned() else "this CPU's own"
    print(f"[1/5] building a {p.size} Qwen2 model and tokenizer offline ({kernels} kernels)", flush=True)
    model_info = make_model(f"{run_dir}/model", corpus_for(p.task, seed), ModelSpec(size=p.size, seed=seed))
    print(f"      {model_info['parameters']:,} parameters, vocabulary {model_info['vocab']}", flush=True)
    print(f"[2/5] writing the {p.task} task: {p.train} train / {p.test} test prompts", flush=True)
    write_task(p.task, f"{run_dir}/data", p.train, p.test, seed)
    print(f"[3/5] supervised warm start, {p.sft_steps} steps", flush=True)
    losses = warm_start(
        f"{run_dir}/model",
        f"{run_dir}/data/train.parquet",
        f"{run_dir}/model_sft",
        steps=p.sft_steps,
        lr=p.sft_lr,
        seed=seed,
        log_every=max(p.sft_steps // 4, 1),
    )
    return {"model": model_info, "sft_final_loss": sum(losses[-20:]) / len(losses[-20:])}
