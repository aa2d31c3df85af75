"""Typed TBA settings: the ``tba:`` config node and the replay sampler's ``sampler_kwargs``, parsed with range
checks, and the names tba-ext registers or writes into verl's config. No verl import.

Every refusal names the config key to change. Counts of updates are optimizer updates (``core.steps``); the
checks of a whole verl config are ``adapters.checks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from math import isfinite
from numbers import Real
from typing import Any


@dataclass
class BetaSchedule:
    """beta (= verl's ``algorithm.kl_ctrl.kl_coef`` at update 1) annealed linearly to ``final`` over
    ``anneal_steps`` optimizer updates.

    ``final=None`` keeps beta constant. The paper's GSM8K run: kl_coef 0.014 -> final 0.004 over 500 updates.
    verl applies one beta per global step: the value at the step's first update.
    """

    final: float | None = None  # beta after the anneal; null = constant beta (verl's kl_ctrl.kl_coef)
    anneal_steps: int = 0  # optimizer updates over which beta moves linearly from kl_coef to final


@dataclass
class LRSchedule:
    """The paper's warmup-stable-decay learning rate (HF's ``get_wsd_schedule`` with cosine decay, the reference
    code's default), in optimizer updates: linear warmup from ``min_lr_ratio`` x peak over ``warmup_updates``, the
    peak (verl's ``actor.optim.lr``) for ``stable_updates``, cosine decay to ``min_lr_ratio`` x peak over
    ``decay_updates``.
    ``name: null`` keeps verl's own schedule (``actor.optim.lr_scheduler_type``). The paper's GSM8K (Table 2):
    50 / 450 / 500."""

    name: str | None = None  # "wsd" or null
    warmup_updates: int = 0  # linear warmup from min_lr_ratio x peak
    stable_updates: int = 0  # at the peak, verl's actor.optim.lr
    decay_updates: int = 0  # down to min_lr_ratio x peak, then held there
    decay_shape: str = "cosine"  # or "linear" (TRL's default schedule: warmup = stable = 0, linear decay)
    min_lr_ratio: float = 0.0  # the schedule's floor, as a share of the peak


@dataclass
class ReplaySettings:
    """The TBA replay buffer and its sampler (reference spec section 2; defaults = the paper's GSM8K).

    Lives in verl's ``trainer.v1.sampler.sampler_kwargs`` (verl's free-form dict for custom samplers)."""

    recency_prob: float = 0.95  # m: probability a group comes from the freshest weight versions
    reward_inv_temp: float = 0.0  # replay branch: softmax(inv_temp * reward) within a prompt; 0 = uniform (GSM8K)
    samples_per_prompt: int | None = None  # S generated per prompt; the trainer draws K = rollout.n of them
    per_prompt_capacity: int = 100  # trajectories kept per prompt; the oldest leave first
    capacity: int = 100_000  # global cap in trajectories
    capacity_bytes: int | None = None  # global cap in bytes (tokens, log-probs, replay.OVERHEAD_BYTES_PER_TRAJECTORY)
    max_staleness: int | None = None  # optimizer updates; staler trajectories leave the store; None = no cap
    max_replays: int | None = None  # times one trajectory may be drawn; reached, it leaves; None = no cap
    # recency branch: trajectories generated within this many optimizer updates of the trainer's current update.
    # 1 = data of the policy being trained (on-policy); decoupled with k = parameter_sync_step: 2k = the newest
    # weight version and the one before, the reference's "last sync" (core/replay.py says why)
    recency_window: int = 1
    max_nonfinite_frac: float = 0.05  # stop the run when more rewards than this are NaN/inf
    # finished fresh groups to wait for before each sample. null: exactly a batch, and only the oldest B finished
    # groups enter the store (each update consumes what was generated for it, as verl's samplers do); a number
    # (0 = never wait while the store can serve a batch): every finished group enters the store at each sample,
    # the decoupled mode's free-running searchers
    min_fresh_groups: int | None = None
    # the initial buffer: no update before the store holds this many distinct prompts (the reference waits for
    # 500 samples, ~21 GSM8K prompts of S = 24); null = one batch (B groups). Applies where every finished group
    # enters the store (min_fresh_groups set, the decoupled configs); lockstep updates wait for their own B groups
    min_buffer_groups: int | None = None
    wait_timeout_s: float = 600.0  # an empty or fully stale store waits this long for data, then stops the run
    # a mixed-staleness batch (tba-prime's {1, 4, 10, 32}): slot i of each batch takes the stored group whose
    # staleness is nearest levels[i % len(levels)], and each group is served once, as generated (no replay, no
    # dedup); null = TBA's recency / replay rule. Feed it a batch per update (min_fresh_groups = B) after an
    # initial buffer of (1 + mean level) batches (min_buffer_groups), as compare's mix arm does
    staleness_mix: list[int] | None = None
    seed: int = 0  # the sampler's random stream (saved and restored with checkpoints)


# keys refused with what replaces them
REMOVED_REPLAY_KEYS = {
    "reward_mix": "the replay branch picks prompts uniformly (cycling without replacement) and weights the "
    "trajectories within a prompt by softmax(reward_inv_temp * reward), as the reference code does; "
    "remove reward_mix",
}


@dataclass
class TBASettings:
    """TBA's trainer settings: verl's top-level ``tba:`` node (counts are optimizer updates)."""

    beta: BetaSchedule = field(default_factory=BetaSchedule)  # beta's schedule (verl applies one per global step)
    ref_reset_every: int = 0  # rho: update the reference from the policy every rho optimizer updates; 0 = never
    # the update: ref <- ref_ema * ref + (1 - ref_ema) * policy; 0 copies the policy (the TBA' reset), 0.9 with
    # ref_reset_every=1 is the EMA reference of the later TBA' runs
    ref_ema: float = 0.0
    # tba_separate_async: prompts kept queued or generating at the searchers, topped up before every update
    # whatever the trainer consumes (free-running searchers); null = verl's lockstep, one batch per global step
    searcher_queue_prompts: int | None = None
    # with the queue: at most this many prompts generated per prompt the trainer consumes, beyond the queue
    # (1.0: searchers keep the queue's lead and no more); null = as fast as the searchers go. Where searchers
    # and trainer share the same cores (CPU), generation nobody trains on only slows the trainer.
    searcher_prompts_per_consumed: float | None = None
    # the fused update (tba_ext.adapters.fused): one actor call per optimizer update, log Z from the training
    # forward, no old-log-prob pass; false = verl's three-call pipeline (old log-probs, advantage, update)
    fused_update: bool = True
    # keep each trajectory's reference log-probs in the replay store and run the reference only on rows without
    # them (fresh data, or data from before a reference reset); false = verl's reference pass on every row
    ref_cache: bool = True
    # with the fused update and the reference in the actor's processes: the rows without stored reference
    # log-probs get them inside the update's own worker call, just before its forward + backward (one call per
    # update); false = verl's separate reference call on those rows first
    ref_in_update: bool = True
    # also recompute the cached rows and report the largest difference (tba/ref_cache_max_sum_diff): a check
    ref_cache_check: bool = False
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)  # the paper's warmup-stable-decay LR (FSDP actor)


def checked_type(value, annotation: str, key: str):
    """``value`` if it has the type a settings field is annotated with (``int``, ``float | None``, ...): no bool
    for a number, an int for a float, no NaN/inf; else a ValueError naming the key (a quoted '8' is a string)."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None and "None" in kinds:
        return value
    ok = (
        ("bool" in kinds and isinstance(value, bool))
        or ("int" in kinds and isinstance(value, int) and not isinstance(value, bool))
        or ("float" in kinds and isinstance(value, int | float) and not isinstance(value, bool) and isfinite(value))
        or ("str" in kinds and isinstance(value, str))
        or (
            "list[int]" in kinds
            and isinstance(value, list | tuple)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
    )
    if not ok:
        names = {
            "None": "null",
            "float": "a finite float",
            "int": "an int",
            "bool": "a bool",
            "str": "a string",
            "list[int]": "a list of ints",
        }
        wanted = " or ".join(names.get(k, k) for k in kinds)
        raise ValueError(f"{key} must be {wanted}, got {value!r} ({type(value).__name__})")
    return value


def _build(cls, node: Mapping[str, Any] | None, prefix: str):
    if node is not None and not isinstance(node, Mapping):
        raise ValueError(f"{prefix.rstrip('.')} must be a mapping of keys, got {node!r}")
    node = dict(node or {})
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(node) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(prefix + k for k in unknown)}; known: {sorted(known)}")
    kwargs = {}
    for name, value in node.items():
        sub = {"beta": BetaSchedule, "lr_schedule": LRSchedule}.get(name) if cls is TBASettings else None
        kwargs[name] = (
            _build(sub, value, f"{prefix}{name}.") if sub else checked_type(value, known[name].type, prefix + name)
        )
    return cls(**kwargs)


def parse_replay_settings(node: Mapping[str, Any] | None, prefix: str) -> ReplaySettings:
    """ReplaySettings from a dict (verl's ``trainer.v1.sampler.sampler_kwargs``), with range checks."""
    for key in set(node if isinstance(node, Mapping) else ()) & set(REMOVED_REPLAY_KEYS):
        raise ValueError(f"{prefix}{key}: {REMOVED_REPLAY_KEYS[key]}")
    r = _build(ReplaySettings, node, prefix)
    checks = [
        (0.0 <= r.recency_prob <= 1.0, "recency_prob must be in [0, 1]", r.recency_prob),
        (
            r.samples_per_prompt is None or r.samples_per_prompt >= 2,
            "samples_per_prompt must be >= 2 or null",
            r.samples_per_prompt,
        ),
        (r.per_prompt_capacity > 0, "per_prompt_capacity must be > 0", r.per_prompt_capacity),
        (r.capacity > 0, "capacity must be > 0", r.capacity),
        (r.capacity_bytes is None or r.capacity_bytes > 0, "capacity_bytes must be > 0 or null", r.capacity_bytes),
        (r.max_staleness is None or r.max_staleness >= 0, "max_staleness must be >= 0 or null", r.max_staleness),
        (r.max_replays is None or r.max_replays >= 1, "max_replays must be >= 1 or null", r.max_replays),
        (r.wait_timeout_s > 0, "wait_timeout_s must be > 0", r.wait_timeout_s),
        (r.recency_window >= 1, "recency_window must be >= 1", r.recency_window),
        (0.0 <= r.max_nonfinite_frac <= 1.0, "max_nonfinite_frac must be in [0, 1]", r.max_nonfinite_frac),
        (
            r.min_fresh_groups is None or r.min_fresh_groups >= 0,
            "min_fresh_groups must be >= 0 or null",
            r.min_fresh_groups,
        ),
        (
            r.min_buffer_groups is None or r.min_buffer_groups >= 1,
            "min_buffer_groups must be >= 1 or null",
            r.min_buffer_groups,
        ),
        (
            r.staleness_mix is None or (len(r.staleness_mix) > 0 and min(r.staleness_mix) >= 0),
            "staleness_mix must be a non-empty list of staleness levels >= 0, or null",
            r.staleness_mix,
        ),
        (
            r.staleness_mix is None or r.max_staleness is None or r.max_staleness >= max(r.staleness_mix),
            f"max_staleness must be >= the largest level of staleness_mix ({r.staleness_mix}): staler groups leave "
            "the store before that level could serve them",
            r.max_staleness,
        ),
        (
            r.staleness_mix is None or r.max_replays in (None, 1),
            "max_replays must be 1 or null with staleness_mix, which serves each group once",
            r.max_replays,
        ),
    ]
    for ok, message, value in checks:
        if not ok:
            raise ValueError(f"{prefix}{message}, got {value}")
    return r


def parse_settings(node: Mapping[str, Any] | None) -> TBASettings:
    """Build TBASettings from the ``tba:`` node (a dict), refusing unknown keys and out-of-range values."""
    settings = _build(TBASettings, node, "tba.")
    checks = [
        (settings.ref_reset_every >= 0, "tba.ref_reset_every must be >= 0", settings.ref_reset_every),
        (0.0 <= settings.ref_ema < 1.0, "tba.ref_ema must be in [0, 1)", settings.ref_ema),
        (
            settings.searcher_queue_prompts is None or settings.searcher_queue_prompts > 0,
            "tba.searcher_queue_prompts must be > 0 or null",
            settings.searcher_queue_prompts,
        ),
        (
            settings.searcher_prompts_per_consumed is None or settings.searcher_prompts_per_consumed > 0,
            "tba.searcher_prompts_per_consumed must be > 0 or null",
            settings.searcher_prompts_per_consumed,
        ),
        (settings.beta.anneal_steps >= 0, "tba.beta.anneal_steps must be >= 0", settings.beta.anneal_steps),
        (
            settings.beta.final is None or settings.beta.final > 0,
            "tba.beta.final must be > 0 or null",
            settings.beta.final,
        ),
        (
            settings.lr_schedule.name in (None, "wsd"),
            "tba.lr_schedule.name must be wsd or null",
            settings.lr_schedule.name,
        ),
        *(
            (
                getattr(settings.lr_schedule, name) >= 0,
                f"tba.lr_schedule.{name} must be >= 0",
                getattr(settings.lr_schedule, name),
            )
            for name in ("warmup_updates", "stable_updates", "decay_updates")
        ),
        (
            0.0 <= settings.lr_schedule.min_lr_ratio <= 1.0,
            "tba.lr_schedule.min_lr_ratio must be in [0, 1]",
            settings.lr_schedule.min_lr_ratio,
        ),
        (
            settings.lr_schedule.decay_shape in ("cosine", "linear"),
            "tba.lr_schedule.decay_shape must be cosine or linear",
            settings.lr_schedule.decay_shape,
        ),
    ]
    for ok, message, value in checks:
        if not ok:
            raise ValueError(f"{message}, got {value}")
    return settings


# The loss modes / advantage estimators tba-ext registers with verl (adapters.losses, checked by doctor)
TB_MODES = ("tb", "tb_pg")


def checked_beta(beta, allow_zero: bool = False) -> float:
    """TB's beta is verl's algorithm.kl_ctrl.kl_coef; TB's residuals divide by it. TBA′ (``allow_zero``) only
    multiplies the KL by it, so beta = 0 is TBA′ without KL regularisation (the stress comparison's arm)."""
    low_ok = (lambda b: b >= 0) if allow_zero else (lambda b: b > 0)
    if isinstance(beta, bool) or not isinstance(beta, Real) or not (low_ok(float(beta)) and float(beta) < float("inf")):
        bound = ">= 0 for tb_pg" if allow_zero else "> 0 for tb (0 only with tb_pg, TBA′ without KL)"
        raise ValueError(f"algorithm.kl_ctrl.kl_coef is TB's beta and must be a finite float {bound}, got {beta!r}")
    return float(beta)


# TBA' clamps pi_theta / pi_rollout at this value unless actor_rollout_ref.actor.policy_loss.is_ratio_max says
# otherwise ([I]: CISPO clip_ratio = 8)
IS_RATIO_MAX = 8.0
IS_RATIO_MAX_KEY = "actor_rollout_ref.actor.policy_loss.is_ratio_max"


def checked_is_ratio_max(value) -> float:
    """TBA′'s clamp of pi_theta / pi_rollout: a finite float >= 1 (a clamp below 1 would also scale down the
    on-policy tokens, whose ratio is 1)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 1.0 <= float(value) < float("inf"):
        raise ValueError(f"{IS_RATIO_MAX_KEY} must be a finite float >= 1, got {value!r}")
    return float(value)


# what a config writes to select tba-ext's pieces (the YAML configs spell the same strings: tests/test_settings.py)
REPLAY_SAMPLER_NAME = "TBAReplaySampler"
REPLAY_SAMPLER_PATH = "pkg://tba_ext.adapters.sampler"
POLICY_LOSS_CONFIG_TARGET = "tba_ext.adapters.policy_loss_config.TBPolicyLossConfig"


SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs."
