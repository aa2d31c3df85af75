"""Typed TBA settings (the ``tba:`` config node) and the start-up checks of a TB run. No verl import.

Every refusal names the config key to change. Every schedule and staleness setting counts optimizer updates
(the paper's unit): one verl global step is ``updates_per_step`` of them (k = parameter_sync_step in
separate_async; train_batch_size / ppo_mini_batch_size x ppo_epochs in general).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional


@dataclass
class BetaSchedule:
    """beta (= verl's ``algorithm.kl_ctrl.kl_coef`` at update 1) annealed linearly to ``final`` over
    ``anneal_steps`` optimizer updates.

    ``final=None`` keeps beta constant. The paper's GSM8K run: kl_coef 0.014 -> final 0.004 over 500 updates.
    verl applies one beta per global step: the value at the step's first update.
    """

    final: Optional[float] = None
    anneal_steps: int = 0


@dataclass
class LRSchedule:
    """The paper's warmup-stable-decay learning rate (HF's ``get_wsd_schedule`` with cosine decay, the reference
    code's default), in optimizer updates: linear warmup from ``min_lr_ratio`` x peak over ``warmup_updates``, the
    peak (verl's ``actor.optim.lr``) for ``stable_updates``, cosine decay to ``min_lr_ratio`` x peak over
    ``decay_updates``.
    ``name: null`` keeps verl's own schedule (``actor.optim.lr_scheduler_type``). The paper's GSM8K (Table 2):
    50 / 450 / 500."""

    name: Optional[str] = None  # "wsd" or null
    warmup_updates: int = 0
    stable_updates: int = 0
    decay_updates: int = 0
    decay_shape: str = "cosine"  # or "linear" (TRL's default schedule: warmup = stable = 0, linear decay)
    min_lr_ratio: float = 0.0


@dataclass
class ReplaySettings:
    """The TBA replay buffer and its sampler (reference spec section 2; defaults = the paper's GSM8K).

    Lives in verl's ``trainer.v1.sampler.sampler_kwargs`` (verl's free-form dict for custom samplers)."""

    recency_prob: float = 0.95  # m: probability a group comes from the freshest weight versions
    reward_inv_temp: float = 0.0  # replay branch: softmax(inv_temp * reward) within a prompt; 0 = uniform (GSM8K)
    samples_per_prompt: Optional[int] = None  # S generated per prompt; the trainer draws K = rollout.n of them
    per_prompt_capacity: int = 100
    capacity: int = 100_000  # global cap in trajectories
    capacity_bytes: Optional[int] = None  # global cap in bytes (tokens + log-probs + ~400 B per trajectory)
    max_staleness: Optional[int] = None  # optimizer updates; staler trajectories leave the store; None = no cap
    max_replays: Optional[int] = None  # times one trajectory may be drawn; reached, it leaves; None = no cap
    # recency branch: trajectories generated within this many optimizer updates of the trainer's current update.
    # 1 = data of the policy being trained (on-policy); decoupled with k = parameter_sync_step: 2k = the newest
    # weight version and the one before, the reference's "last sync" (core/replay.py says why)
    recency_window: int = 1
    max_nonfinite_frac: float = 0.05  # stop the run when more rewards than this are NaN/inf
    # finished fresh groups to wait for before each sample. null: exactly a batch, and only the oldest B finished
    # groups enter the store (each update consumes what was generated for it, as verl's samplers do); a number
    # (0 = never wait while the store can serve a batch): every finished group enters the store at each sample,
    # the decoupled mode's free-running searchers
    min_fresh_groups: Optional[int] = None
    # the initial buffer: no update before the store holds this many distinct prompts (the reference waits for
    # 500 samples, ~21 GSM8K prompts of S = 24); null = one batch (B groups). Applies where every finished group
    # enters the store (min_fresh_groups set, the decoupled configs); lockstep updates wait for their own B groups
    min_buffer_groups: Optional[int] = None
    wait_timeout_s: float = 600.0  # an empty or fully stale store waits this long for data, then stops the run
    seed: int = 0


# keys an older tba-ext accepted, with what replaces them
REMOVED_REPLAY_KEYS = {
    "reward_mix": "the replay branch now picks prompts uniformly (cycling without replacement) and weights the "
                  "trajectories within a prompt by softmax(reward_inv_temp * reward), as the reference code does; "
                  "remove reward_mix",
}


@dataclass
class TBASettings:
    beta: BetaSchedule = field(default_factory=BetaSchedule)
    ref_reset_every: int = 0  # rho: update the reference from the policy every rho optimizer updates; 0 = never
    # the update: ref <- ref_ema * ref + (1 - ref_ema) * policy; 0 copies the policy (the TBA' reset), 0.9 with
    # ref_reset_every=1 is the EMA reference of the later TBA' runs
    ref_ema: float = 0.0
    # tba_separate_async: prompts kept queued or generating at the searchers, topped up before every update
    # whatever the trainer consumes (free-running searchers); null = verl's lockstep, one batch per global step
    searcher_queue_prompts: Optional[int] = None
    # with the queue: at most this many prompts generated per prompt the trainer consumes, beyond the queue
    # (1.0: searchers keep the queue's lead and no more); null = as fast as the searchers go. Where searchers
    # and trainer share the same cores (CPU), generation nobody trains on only slows the trainer.
    searcher_prompts_per_consumed: Optional[float] = None
    # the fused update (tba_ext.adapters.fused): one actor call per optimizer update, log Z from the training
    # forward, no old-log-prob pass; false = verl's three-call pipeline (old log-probs, advantage, update)
    fused_update: bool = True
    # keep each trajectory's reference log-probs in the replay store and run the reference only on rows without
    # them (fresh data, or data from before a reference reset); false = verl's reference pass on every row
    ref_cache: bool = True
    # also recompute the cached rows and report the largest difference (tba/ref_cache_max_sum_diff): a check
    ref_cache_check: bool = False
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)


def _build(cls, node: Mapping[str, Any] | None, prefix: str):
    node = dict(node or {})
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(node) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(prefix + k for k in unknown)}; known: {sorted(known)}")
    kwargs = {}
    for name, value in node.items():
        sub = {"beta": BetaSchedule, "lr_schedule": LRSchedule}.get(name) if cls is TBASettings else None
        kwargs[name] = _build(sub, value, f"{prefix}{name}.") if sub else value
    return cls(**kwargs)


def parse_replay_settings(node: Mapping[str, Any] | None, prefix: str) -> ReplaySettings:
    """ReplaySettings from a dict (verl's ``trainer.v1.sampler.sampler_kwargs``), with range checks."""
    for key in set(node or {}) & set(REMOVED_REPLAY_KEYS):
        raise ValueError(f"{prefix}{key}: {REMOVED_REPLAY_KEYS[key]}")
    r = _build(ReplaySettings, node, prefix)
    checks = [
        (0.0 <= r.recency_prob <= 1.0, "recency_prob must be in [0, 1]", r.recency_prob),
        (r.samples_per_prompt is None or r.samples_per_prompt >= 2, "samples_per_prompt must be >= 2 or null",
         r.samples_per_prompt),
        (r.per_prompt_capacity > 0, "per_prompt_capacity must be > 0", r.per_prompt_capacity),
        (r.capacity > 0, "capacity must be > 0", r.capacity),
        (r.capacity_bytes is None or r.capacity_bytes > 0, "capacity_bytes must be > 0 or null", r.capacity_bytes),
        (r.max_staleness is None or r.max_staleness >= 0, "max_staleness must be >= 0 or null", r.max_staleness),
        (r.max_replays is None or r.max_replays >= 1, "max_replays must be >= 1 or null", r.max_replays),
        (r.wait_timeout_s > 0, "wait_timeout_s must be > 0", r.wait_timeout_s),
        (r.recency_window >= 1, "recency_window must be >= 1", r.recency_window),
        (0.0 <= r.max_nonfinite_frac <= 1.0, "max_nonfinite_frac must be in [0, 1]", r.max_nonfinite_frac),
        (r.min_fresh_groups is None or r.min_fresh_groups >= 0, "min_fresh_groups must be >= 0 or null",
         r.min_fresh_groups),
        (r.min_buffer_groups is None or r.min_buffer_groups >= 1, "min_buffer_groups must be >= 1 or null",
         r.min_buffer_groups),
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
        (settings.searcher_queue_prompts is None or settings.searcher_queue_prompts > 0,
         "tba.searcher_queue_prompts must be > 0 or null", settings.searcher_queue_prompts),
        (settings.searcher_prompts_per_consumed is None or settings.searcher_prompts_per_consumed > 0,
         "tba.searcher_prompts_per_consumed must be > 0 or null", settings.searcher_prompts_per_consumed),
        (settings.beta.anneal_steps >= 0, "tba.beta.anneal_steps must be >= 0", settings.beta.anneal_steps),
        (settings.beta.final is None or settings.beta.final > 0, "tba.beta.final must be > 0 or null",
         settings.beta.final),
        (settings.lr_schedule.name in (None, "wsd"), "tba.lr_schedule.name must be wsd or null",
         settings.lr_schedule.name),
        (min(settings.lr_schedule.warmup_updates, settings.lr_schedule.stable_updates,
             settings.lr_schedule.decay_updates) >= 0, "tba.lr_schedule.*_updates must be >= 0",
         settings.lr_schedule),
        (0.0 <= settings.lr_schedule.min_lr_ratio <= 1.0, "tba.lr_schedule.min_lr_ratio must be in [0, 1]",
         settings.lr_schedule.min_lr_ratio),
        (settings.lr_schedule.decay_shape in ("cosine", "linear"), "tba.lr_schedule.decay_shape must be cosine or "
         "linear", settings.lr_schedule.decay_shape),
    ]
    for ok, message, value in checks:
        if not ok:
            raise ValueError(f"{message}, got {value}")
    return settings


# The loss modes / advantage estimators tba-ext registers with verl (adapters.losses, checked by doctor)
TB_MODES = ("tb", "tb_pg")


def checked_beta(beta) -> float:
    """TB's beta is verl's algorithm.kl_ctrl.kl_coef; the residuals divide by it."""
    if beta is None or not float(beta) > 0:
        raise ValueError(f"algorithm.kl_ctrl.kl_coef is TB's beta and must be > 0, got {beta}")
    return float(beta)


def step_folder(default_local_dir: str, global_step: int) -> str:
    """verl's checkpoint folder of a global step (``trainer.default_local_dir``/global_step_N)."""
    return os.path.join(default_local_dir, f"global_step_{global_step}")


def hf_model_dir(default_local_dir: str, global_step: int) -> str:
    """The Hugging Face copy verl saves with ``checkpoint.save_contents`` including hf_model."""
    return os.path.join(step_folder(default_local_dir, global_step), "actor", "huggingface")


def check_tb_run(cfg: Mapping[str, Any]) -> None:
    """Refuse verl settings that break the TB estimator. ``cfg`` is the full verl config as nested dicts."""
    algo = cfg["algorithm"]
    actor = cfg["actor_rollout_ref"]["actor"]
    rollout = cfg["actor_rollout_ref"]["rollout"]
    estimator = algo.get("adv_estimator")
    loss_mode = actor.get("policy_loss", {}).get("loss_mode")
    tb_estimator = estimator in TB_MODES
    if loss_mode in TB_MODES and estimator != loss_mode:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} needs algorithm.adv_estimator={loss_mode}, "
            f"got {estimator}"
        )
    if not tb_estimator:
        return
    checked_beta(algo.get("kl_ctrl", {}).get("kl_coef"))
    if not algo.get("use_kl_in_reward", False):
        raise ValueError("TB needs algorithm.use_kl_in_reward=True (the reference log-probs enter through it)")
    if algo.get("kl_penalty", "kl") != "kl":
        raise ValueError(
            f"TB needs algorithm.kl_penalty=kl (the k1 sequence log-ratio of eq. 5), got {algo.get('kl_penalty')}"
        )
    if algo.get("kl_ctrl", {}).get("type", "fixed") != "fixed":
        raise ValueError("TB needs algorithm.kl_ctrl.type=fixed (beta moves only by tba.beta)")
    if int(rollout.get("n", 1)) < 2:
        raise ValueError(f"TB needs actor_rollout_ref.rollout.n >= 2 (a VarGrad group), got {rollout.get('n')}")
    correction = algo.get("rollout_correction") or {}
    if correction.get("bypass_mode", False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=True replaces old log-probs by rollout log-probs, which "
            "breaks TB's log Z estimate; set it to False"
        )
    if loss_mode == "tb" and correction.get("rollout_is"):
        raise ValueError("TB takes no importance weights: set algorithm.rollout_correction.rollout_is=null")
    if loss_mode == "tb_pg":
        check_tb_pg_importance_weights(correction, actor.get("policy_loss", {}), rollout)
    if actor.get("use_kl_loss", False):
        raise ValueError("TB carries its KL term in the reward: set actor_rollout_ref.actor.use_kl_loss=False")


def updates_per_step(cfg: Mapping[str, Any]) -> int:
    """Optimizer updates in one verl global step: one per mini-batch and PPO epoch (in separate_async the
    mini-batch count is k = parameter_sync_step, verl's own contract)."""
    actor = cfg["actor_rollout_ref"]["actor"]
    batch, mini = int(cfg["data"]["train_batch_size"]), int(actor["ppo_mini_batch_size"])
    return int(actor.get("ppo_epochs", 1)) * max(batch // mini, 1)


def trainer_version(global_step: int, local_update: int, updates_per_step: int, local_updates: int) -> int:
    """Optimizer updates already applied to the policy that trains at ``local_update`` (from 0) of verl global
    step ``global_step`` (from 1), whose ``updates_per_step`` updates are made in ``local_updates`` samples (k in
    separate_async, else 1): the version the staleness of the sampled data is counted against."""
    return (max(global_step, 1) - 1) * updates_per_step + local_update * (updates_per_step // local_updates)


def check_reference_updates(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """Refuse, at start-up, a reference update (``tba.ref_reset_every``) that could not run: the copy works on
    FSDP2 engines (DTensor shards updated in place), with the reference beside the actor (hybrid) or in its
    own worker group."""
    if not settings.ref_reset_every:
        if settings.ref_ema:
            raise ValueError("tba.ref_ema is set but tba.ref_reset_every=0 never updates the reference; set "
                             "tba.ref_reset_every (1 = after every update)")
        return
    aro = cfg["actor_rollout_ref"]
    for role in ("actor", "ref"):
        strategy = (aro.get(role) or {}).get("strategy", "fsdp")
        if strategy != "fsdp2":
            raise ValueError(f"tba.ref_reset_every needs FSDP2 engines (actor_rollout_ref.{role}.strategy=fsdp2); "
                             f"with strategy={strategy} the reference cannot be updated: set tba.ref_reset_every=0")
    model = aro.get("model", {})
    lora_rank = (model.get("lora") or {}).get("rank", 0) or model.get("lora_rank", 0)
    if lora_rank or model.get("lora_adapter_path"):
        raise ValueError("tba.ref_reset_every cannot update a LoRA run's reference (it is the base model under the "
                         "adapter): set tba.ref_reset_every=0 or train without LoRA")
    algo = cfg["algorithm"]
    if not (algo.get("use_kl_in_reward") or aro["actor"].get("use_kl_loss")):
        raise ValueError("tba.ref_reset_every is set but the run has no reference policy (neither "
                         "algorithm.use_kl_in_reward nor actor_rollout_ref.actor.use_kl_loss)")


def dataloader_fetch(data: Mapping[str, Any]) -> int:
    """Prompts verl's dataloader hands over at once: ``data.gen_batch_size``, else ``data.train_batch_size``."""
    return data.get("gen_batch_size") or data["train_batch_size"]


def check_searcher_queue(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """Free-running searchers (``tba.searcher_queue_prompts``) need the decoupled trainer and room for at least
    one dataloader fetch."""
    queue = settings.searcher_queue_prompts
    if queue is None:
        if settings.searcher_prompts_per_consumed is not None:
            raise ValueError("tba.searcher_prompts_per_consumed paces free-running searchers: it needs "
                             "tba.searcher_queue_prompts")
        return
    mode = cfg["trainer"]["v1"].get("trainer_mode")
    if mode != "tba_separate_async":
        raise ValueError(f"tba.searcher_queue_prompts needs trainer.v1.trainer_mode=tba_separate_async (decoupled "
                         f"searchers), got {mode}")
    chunk = dataloader_fetch(cfg["data"])
    if queue < chunk:
        raise ValueError(f"tba.searcher_queue_prompts={queue} is below one dataloader fetch of {chunk} prompts "
                         "(data.gen_batch_size, else data.train_batch_size): nothing could be queued")


def prompts_to_queue(queue: int, inflight: int, chunk: int, submitted: int, consumed: int,
                     per_consumed: float | None) -> int:
    """Prompts to hand the searchers now (whole dataloader ``chunk``s): enough to bring those queued or generating
    up to ``queue``; paced (``per_consumed``), never more than ``queue + per_consumed * consumed`` submitted in
    all, so the searchers stay at most the queue ahead of what the trainer consumes."""
    missing = queue - inflight
    if per_consumed is not None:
        missing = min(missing, int(queue + per_consumed * consumed) - submitted)
    return max(missing, 0) // chunk * chunk


def fused_update_plan(cfg: Mapping[str, Any], settings: TBASettings) -> tuple[bool, str]:
    """Whether a tb / tb_pg run takes the fused update, and why not when it does not. Refuses, naming the key,
    settings under which a micro-batch could not hold whole prompt groups (log Z is a group mean of the forward)."""
    algo, aro = cfg["algorithm"], cfg["actor_rollout_ref"]
    actor, n = aro["actor"], int(aro["rollout"]["n"])
    if algo.get("adv_estimator") not in TB_MODES:
        return False, "not a tb / tb_pg run"
    if not settings.fused_update:
        return False, "tba.fused_update=false"
    if actor.get("strategy") == "megatron":
        return False, ("Megatron actor: verl's three-call update (old log-probs, advantage, update); the fused "
                       "update needs the FSDP engine's force_group_size micro-batching")
    prefix = "actor_rollout_ref.actor."
    if actor.get("shuffle", False):
        raise ValueError(f"{prefix}shuffle=True splits prompt groups across mini-batches; the fused TB update takes "
                         "log Z from whole groups: set it to False (or tba.fused_update=false)")
    if actor.get("use_dynamic_bsz", False):
        data = cfg["data"]
        group_tokens = n * (int(data["max_prompt_length"]) + int(data["max_response_length"]))
        if int(actor.get("ppo_max_token_len_per_gpu") or 0) < group_tokens:
            raise ValueError(f"{prefix}ppo_max_token_len_per_gpu={actor.get('ppo_max_token_len_per_gpu')} cannot "
                             f"hold one prompt group of rollout.n={n} at full length ({group_tokens} tokens); the "
                             "fused TB update keeps groups whole per micro-batch: raise it")
    else:
        micro = actor.get("ppo_micro_batch_size_per_gpu")
        if micro is None or int(micro) % n:
            raise ValueError(f"{prefix}ppo_micro_batch_size_per_gpu={micro} must be a multiple of rollout.n={n}: the "
                             "fused TB update keeps prompt groups whole per micro-batch")
    trainer = cfg["trainer"]
    dp = int(trainer.get("n_gpus_per_node", 1)) * int(trainer.get("nnodes", 1))
    dp //= int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    k = int(((trainer.get("v1") or {}).get("separate_async") or {}).get("parameter_sync_step", 1) or 1)
    if trainer.get("v1", {}).get("trainer_mode") != "tba_separate_async":
        k = 1
    per_update = int(cfg["data"]["train_batch_size"]) // k
    if per_update % dp or int(actor["ppo_mini_batch_size"]) % dp:
        raise ValueError(f"data.train_batch_size / k = {per_update} and {prefix}ppo_mini_batch_size="
                         f"{actor['ppo_mini_batch_size']} prompts must be multiples of the {dp} data-parallel "
                         "ranks: the fused TB update gives each rank whole prompt groups")
    return True, "fused"


def check_tba_run(cfg: Mapping[str, Any]) -> tuple[TBASettings, ReplaySettings | None]:
    """Every start-up check of a run (full verl config as nested dicts): the ``tba:`` node, the TB estimator,
    the replay sampler, reference updates, free-running searchers and the fused update. Returns the parsed settings."""
    settings = parse_settings(cfg.get("tba"))
    check_tb_run(cfg)
    replay = check_replay_run(cfg)
    check_reference_updates(cfg, settings)
    check_searcher_queue(cfg, settings)
    check_lr_schedule(cfg, settings)
    fused_update_plan(cfg, settings)
    return settings, replay


def check_lr_schedule(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """``tba.lr_schedule`` replaces the actor's scheduler in its FSDP engine; verl's own warmup and schedule
    would be silently overridden, so they must be left at their defaults."""
    if settings.lr_schedule.name is None:
        return
    actor = cfg["actor_rollout_ref"]["actor"]
    if actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2"):
        raise ValueError(f"tba.lr_schedule replaces the FSDP engine's scheduler; actor_rollout_ref.actor.strategy="
                         f"{actor.get('strategy')} keeps its own: set tba.lr_schedule.name=null")
    optim = actor.get("optim") or {}
    if optim.get("lr_scheduler_type", "constant") != "constant" or (optim.get("lr_warmup_steps") or -1) > 0 \
            or (optim.get("lr_warmup_steps_ratio") or 0.0) > 0:
        raise ValueError("tba.lr_schedule sets the warmup and decay itself: leave actor_rollout_ref.actor.optim."
                         "lr_scheduler_type=constant with no lr_warmup_steps / lr_warmup_steps_ratio")


def scheduler_updates_per_call(cfg: Mapping[str, Any]) -> int:
    """Optimizer updates per verl scheduler step: verl steps the actor's scheduler once per ``update_actor`` call,
    which is one per global step, or one per local update in separate_async."""
    mode = cfg["trainer"].get("v1", {}).get("trainer_mode", "")
    calls = int(cfg["trainer"]["v1"]["separate_async"]["parameter_sync_step"]) if mode.endswith("separate_async") \
        else 1
    return updates_per_step(cfg) // calls


# TBA' clamps pi_theta / pi_rollout at this value unless actor_rollout_ref.actor.policy_loss.is_ratio_max says
# otherwise ([I]: CISPO clip_ratio = 8)
IS_RATIO_MAX = 8.0


def check_tb_pg_importance_weights(correction: Mapping[str, Any], policy_loss: Mapping[str, Any],
                                   rollout: Mapping[str, Any]) -> None:
    """TBA' weights each token by min(pi_theta / pi_rollout, is_ratio_max). verl supplies pi_old / pi_rollout
    (``rollout_is_weights``, from the searcher's log-probs) when token-level rollout IS is on; the loss
    multiplies it by pi_theta / pi_old and clamps. verl's own truncation must not bite first."""
    prefix = "algorithm.rollout_correction."
    if correction.get("rollout_is") != "token":
        raise ValueError(f"tb_pg weights tokens by pi_theta / pi_rollout: set {prefix}rollout_is=token "
                         f"(got {correction.get('rollout_is')}); verl then passes pi_old / pi_rollout to the loss")
    is_ratio_max = float(policy_loss.get("is_ratio_max", IS_RATIO_MAX))
    threshold = correction.get("rollout_is_threshold", 2.0)
    if isinstance(threshold, str) and "_" in threshold or float(threshold) < 1e3 * is_ratio_max:
        raise ValueError(f"tb_pg clamps the whole ratio at actor_rollout_ref.actor.policy_loss.is_ratio_max="
                         f"{is_ratio_max}; verl's truncation {prefix}rollout_is_threshold={threshold} would clip "
                         f"pi_old / pi_rollout first: set it to 1e6 (or above 1000 * is_ratio_max)")
    if correction.get("rollout_is_batch_normalize", False):
        raise ValueError(f"tb_pg needs the raw ratio: set {prefix}rollout_is_batch_normalize=False")
    if not rollout.get("calculate_log_probs", False):
        raise ValueError("tb_pg needs the searcher's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True")


REPLAY_SAMPLER_NAME = "TBAReplaySampler"


def uses_replay_sampler(cfg: Mapping[str, Any]) -> bool:
    """Whether a full verl config (nested dicts or a DictConfig) selects tba-ext's replay sampler."""
    sampler = ((cfg.get("trainer") or {}).get("v1") or {}).get("sampler") or {}
    return (sampler.get("custom_sampler") or {}).get("name") == REPLAY_SAMPLER_NAME


SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs."


def check_replay_run(cfg: Mapping[str, Any]) -> ReplaySettings | None:
    """The replay settings of a full verl config (None without the replay sampler), checked against verl's
    own keys: the trainer draws K = rollout.n of the S = samples_per_prompt generated per prompt."""
    n = int(cfg["actor_rollout_ref"]["rollout"].get("n", 1))
    if not uses_replay_sampler(cfg):
        return None
    settings = parse_replay_settings(cfg["trainer"]["v1"]["sampler"].get("sampler_kwargs"), SAMPLER_KWARGS)
    s = settings.samples_per_prompt
    if s is not None and s < n:
        raise ValueError(f"{SAMPLER_KWARGS}samples_per_prompt={s} is S, generated per prompt; it must be >= "
                         f"actor_rollout_ref.rollout.n={n}, the K the trainer draws per group")
    mode = cfg["trainer"]["v1"].get("trainer_mode", "sync")
    if s is not None and s > n and not str(mode).startswith("tba_"):
        raise ValueError(f"{SAMPLER_KWARGS}samples_per_prompt={s} > rollout.n needs a tba_* trainer mode (it asks "
                         f"the searchers for S samples per prompt); trainer.v1.trainer_mode is {mode}")
    k = int(((cfg["trainer"]["v1"].get("separate_async") or {}).get("parameter_sync_step") or 1)
            if mode == "tba_separate_async" else 1)
    if settings.max_staleness is not None and settings.max_staleness < k - 1:
        raise ValueError(f"{SAMPLER_KWARGS}max_staleness={settings.max_staleness}: decoupled searchers hold weights "
                         f"up to k - 1 = {k - 1} updates older than the trainer's at local updates 2..k "
                         f"(trainer.v1.separate_async.parameter_sync_step={k}), so no batch could be served; set it "
                         f">= {k - 1}")
    if (s or n) > settings.per_prompt_capacity:
        raise ValueError(f"{SAMPLER_KWARGS}per_prompt_capacity={settings.per_prompt_capacity} cannot hold one "
                         f"generation of {s or n} samples per prompt; raise it")
    return settings
