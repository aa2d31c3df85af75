"""Start-up checks of a TB / TBA run against verl's config (the full config as nested dicts): each refusal names
the config key to change. Called by the trainer modes (``adapters.trainer``) and by ``tba-ext train``'s preflight
before Ray starts; reads verl's keys, imports nothing of verl.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from tba_ext.core.replay import REPLAY_FILE, check_store_file
from tba_ext.core.settings import (
    IS_RATIO_MAX,
    IS_RATIO_MAX_KEY,
    REPLAY_SAMPLER_NAME,
    SAMPLER_KWARGS,
    TB_MODES,
    ReplaySettings,
    TBASettings,
    checked_beta,
    checked_is_ratio_max,
    checked_type,
    parse_replay_settings,
    parse_settings,
)
from tba_ext.core.steps import (
    dataloader_fetch,
    epochs_for_steps,
    is_tba_mode,
    local_updates,
    scheduler_updates_per_call,
    step_folder,
    steps_per_epoch,
    verl_dataloader_fetch,
    verl_mode,
)

_ABSENT = object()
# what to do when a resume's replay store is refused (the preflight and the trainer say it alike)
RESUME_REMEDY = (
    "To go on: resume from an earlier checkpoint (trainer.resume_mode=resume_path trainer.resume_from_path=<an "
    "earlier global_step_N>), or move the file away to resume this checkpoint with an empty replay store"
)


def resume_folder(trainer: Mapping[str, Any]) -> str | None:
    """The checkpoint folder verl will resume from: ``resume_from_path`` (resume_path), the latest under
    ``default_local_dir`` (auto, when its tracker file exists), else None."""
    mode = trainer.get("resume_mode", "auto")
    if mode == "resume_path":
        return trainer.get("resume_from_path")
    tracker = os.path.join(str(trainer.get("default_local_dir")), "latest_checkpointed_iteration.txt")
    if mode != "auto" or not os.path.exists(tracker):
        return None
    with open(tracker) as f:
        return step_folder(str(trainer["default_local_dir"]), int(f.read().strip()))


def check_resume_store(trainer: Mapping[str, Any]) -> None:
    """The replay store of the checkpoint a run resumes from, checked whole before Ray starts: a damaged one is
    refused here, naming the file, rather than after the models load."""
    folder = resume_folder(trainer)
    path = os.path.join(folder, REPLAY_FILE) if folder else None
    if path and os.path.exists(path):
        try:
            check_store_file(path)
        except ValueError as exc:
            raise ValueError(f"{exc}. {RESUME_REMEDY}") from exc


# verl's keys a run depends on, with the type (``checked_type``'s annotation) and range they need: verl reads them
# without a check, or checks them only after Ray and its workers started. A key the config lacks is skipped.
VERL_VALUES = (
    ("data.train_batch_size", "int", ">0"),
    ("data.max_prompt_length", "int", ">0"),
    ("data.max_response_length", "int", ">0"),
    ("data.gen_batch_size", "int | None", ">0"),
    ("data.train_max_samples", "int", ""),  # <= 0: every row
    ("data.val_max_samples", "int", ""),
    ("data.shuffle", "bool", ""),
    ("data.seed", "int | None", ""),
    ("data.prompt_key", "str", ""),
    ("trainer.total_training_steps", "int | None", ">0"),
    ("trainer.total_epochs", "int", ">0"),
    ("trainer.n_gpus_per_node", "int", ">0"),
    ("trainer.nnodes", "int", ">0"),
    ("trainer.v1.trainer_mode", "str", ""),  # a name in verl's trainer registry (tools.config)
    ("trainer.v1.colocate_async.num_warmup_batches", "int | float", ""),  # <= 0: no warm-up batches
    ("trainer.v1.separate_async.num_warmup_batches", "int | float", ""),
    ("trainer.v1.separate_async.parameter_sync_step", "int", ">0"),
    ("algorithm.adv_estimator", "str", ""),
    ("algorithm.use_kl_in_reward", "bool", ""),
    ("algorithm.kl_ctrl.kl_coef", "float", ">=0"),
    ("algorithm.gamma", "float", ""),
    ("algorithm.lam", "float", ""),
    ("algorithm.rollout_correction.bypass_mode", "bool", ""),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", "bool", ""),
    ("actor_rollout_ref.hybrid_engine", "bool", ""),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "int", ">0"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "int | None", ">0"),
    ("actor_rollout_ref.actor.ppo_epochs", "int", ">0"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "bool", ""),
    ("actor_rollout_ref.actor.shuffle", "bool", ""),
    ("actor_rollout_ref.actor.use_kl_loss", "bool", ""),
    ("actor_rollout_ref.actor.entropy_coeff", "float", ""),
    ("actor_rollout_ref.actor.clip_ratio", "float", ">0"),
    (
        "actor_rollout_ref.actor.loss_agg_mode",
        "str",
        "token-mean|token-sum|seq-mean-token-sum|seq-mean-token-mean|seq-mean-token-sum-norm",
    ),
    ("actor_rollout_ref.actor.optim.lr", "float", ">0"),
    ("actor_rollout_ref.actor.optim.weight_decay", "float", ">=0"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "int | None", ">0"),
    ("actor_rollout_ref.rollout.n", "int", ">0"),
    ("actor_rollout_ref.rollout.temperature", "float", ">0"),
    ("actor_rollout_ref.rollout.top_p", "float", "(0,1]"),
    ("actor_rollout_ref.rollout.calculate_log_probs", "bool", ""),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "int | None", ">0"),
)
_RANGES = {
    ">0": (lambda v: v > 0, "> 0"),
    ">=0": (lambda v: v >= 0, ">= 0"),
    "(0,1]": (lambda v: 0 < v <= 1, "in (0, 1]"),
}


def _lookup(cfg: Mapping[str, Any], dotted: str):
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def check_verl_values(cfg: Mapping[str, Any]) -> None:
    """Refuse a value of ``VERL_VALUES`` of the wrong type or out of range, naming the key; and a batch that does
    not split into the updates' mini-batches (``check_batch_split``)."""
    for key, annotation, allowed in VERL_VALUES:
        value = _lookup(cfg, key)
        if value is _ABSENT:
            continue
        checked_type(value, annotation, key)
        if value is None or not allowed:
            continue
        if allowed in _RANGES:
            ok, text = _RANGES[allowed]
            if not ok(value):
                raise ValueError(f"{key} must be {text}, got {value!r}")
        elif value not in allowed.split("|"):
            raise ValueError(f"{key} must be one of {allowed.replace('|', ', ')}, got {value!r}")
    check_batch_split(cfg)


def check_micro_batch_sizes(cfg: Mapping[str, Any]) -> None:
    """verl's rule (its ``validate_config``, which refuses with a traceback from verl's process): each of the
    actor, rollout and (where used) reference sets exactly one of its micro-batch sizes, unless dynamic."""
    aro, algo = cfg["actor_rollout_ref"], cfg["algorithm"]
    if not aro["actor"].get("use_dynamic_bsz", False):
        uses_ref = algo.get("use_kl_in_reward", False) or aro["actor"].get("use_kl_loss", False)
        for role, name in (("actor", "ppo_micro_batch_size"), ("rollout", "log_prob_micro_batch_size")) + (
            (("ref", "log_prob_micro_batch_size"),) if uses_ref else ()
        ):
            node = aro.get(role) or {}
            old, per_gpu = node.get(name), node.get(f"{name}_per_gpu")
            if (old is None) == (per_gpu is None):
                raise ValueError(
                    f"set actor_rollout_ref.{role}.{name}_per_gpu "
                    + ("and remove" if old is not None else "(or the deprecated")
                    + f" actor_rollout_ref.{role}.{name}"
                    + ("" if old is not None else "), or actor_rollout_ref.actor.use_dynamic_bsz=true")
                    + f": got {name}={old!r}, {name}_per_gpu={per_gpu!r}"
                )


def check_batch_split(cfg: Mapping[str, Any]) -> None:
    """Each update takes whole mini-batches of the prompts a step trains on: ``data.train_batch_size`` (per local
    update: / k in separate_async, where verl asserts train_batch_size = k x ppo_mini_batch_size)."""
    batch = cfg["data"]["train_batch_size"]
    mini = cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]
    v1 = cfg["trainer"].get("v1") or {}
    mode = str(v1.get("trainer_mode", "sync"))
    if verl_mode(mode) == "separate_async":
        k = local_updates(cfg)
        if batch != k * mini:
            raise ValueError(
                f"trainer.v1.trainer_mode={mode}: data.train_batch_size={batch} must equal "
                f"trainer.v1.separate_async.parameter_sync_step={k} x actor_rollout_ref.actor.ppo_mini_batch_size="
                f"{mini} (verl's separate_async trains one mini-batch per local update)"
            )
        rollout = cfg["actor_rollout_ref"]["rollout"]
        for key in ("nnodes", "n_gpus_per_node"):
            if not isinstance(rollout.get(key), int) or rollout.get(key) < 1:
                raise ValueError(
                    f"trainer.v1.trainer_mode={mode} generates on a standalone rollout pool: "
                    f"actor_rollout_ref.rollout.{key} must be >= 1, got {rollout.get(key)!r} (cpu_tba_decoupled "
                    "shows the settings, actor_rollout_ref.hybrid_engine=false among them)"
                )
    elif batch < mini or batch % mini:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={batch}: "
            "each update takes a whole mini-batch of the step's prompts"
        )


def _nearest_multiples(value: int, every: int) -> str:
    below = value // every * every
    return f"{below} or {below + every}" if below else str(every)


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
    if tb_estimator and loss_mode != estimator:
        raise ValueError(
            f"algorithm.adv_estimator={estimator} needs actor_rollout_ref.actor.policy_loss.loss_mode={estimator}, "
            f"got {loss_mode} (the TB advantage is made for its own loss)"
        )
    if not tb_estimator:
        return
    checked_beta(algo.get("kl_ctrl", {}).get("kl_coef"), allow_zero=estimator == "tb_pg")
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
        if actor.get("loss_agg_mode") == "seq-mean-token-sum-norm" and actor.get("loss_scale_factor") is None:
            raise ValueError(
                "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm divides by "
                "actor_rollout_ref.actor.loss_scale_factor, which is unset: verl then divides each micro-batch by "
                "its own padded length and the gradient depends on how the batch is split; set it to a constant "
                "(data.max_response_length, as Dr. GRPO does)"
            )
    if actor.get("use_kl_loss", False):
        raise ValueError("TB carries its KL term in the reward: set actor_rollout_ref.actor.use_kl_loss=False")


def check_reference_updates(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """Refuse, at start-up, a reference update (``tba.ref_reset_every``) that could not run: the copy works on
    FSDP2 engines (DTensor shards updated in place), with the reference beside the actor (hybrid) or in its
    own worker group."""
    if not settings.ref_reset_every:
        if settings.ref_ema:
            raise ValueError(
                "tba.ref_ema is set but tba.ref_reset_every=0 never updates the reference; set "
                "tba.ref_reset_every (1 = after every update)"
            )
        return
    per_call = max(scheduler_updates_per_call(cfg), 1)
    if settings.ref_reset_every % per_call:
        raise ValueError(
            f"tba.ref_reset_every={settings.ref_reset_every} would fall inside one update_actor call of {per_call} "
            "optimizer updates (data.train_batch_size / actor_rollout_ref.actor.ppo_mini_batch_size x ppo_epochs, "
            "per trainer.v1.separate_async.parameter_sync_step in tba_separate_async); the reference moves between "
            f"calls: set tba.ref_reset_every to a multiple of {per_call} "
            f"({_nearest_multiples(settings.ref_reset_every, per_call)})"
        )
    aro = cfg["actor_rollout_ref"]
    for role in ("actor", "ref"):
        strategy = (aro.get(role) or {}).get("strategy", "fsdp")
        if strategy != "fsdp2":
            raise ValueError(
                f"tba.ref_reset_every needs FSDP2 engines (actor_rollout_ref.{role}.strategy=fsdp2); "
                f"with strategy={strategy} the reference cannot be updated: set tba.ref_reset_every=0"
            )
    model = aro.get("model", {})
    lora_rank = (model.get("lora") or {}).get("rank", 0) or model.get("lora_rank", 0)
    if lora_rank or model.get("lora_adapter_path"):
        raise ValueError(
            "tba.ref_reset_every cannot update a LoRA run's reference (it is the base model under the "
            "adapter): set tba.ref_reset_every=0 or train without LoRA"
        )
    algo = cfg["algorithm"]
    if not (algo.get("use_kl_in_reward") or aro["actor"].get("use_kl_loss")):
        raise ValueError(
            "tba.ref_reset_every is set but the run has no reference policy (neither "
            "algorithm.use_kl_in_reward nor actor_rollout_ref.actor.use_kl_loss)"
        )


def check_searcher_queue(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """Free-running searchers (``tba.searcher_queue_prompts``) need the decoupled trainer and room for at least
    one dataloader fetch."""
    queue = settings.searcher_queue_prompts
    if queue is None:
        if settings.searcher_prompts_per_consumed is not None:
            raise ValueError(
                "tba.searcher_prompts_per_consumed paces free-running searchers: it needs tba.searcher_queue_prompts"
            )
        return
    mode = cfg["trainer"]["v1"].get("trainer_mode")
    if mode != "tba_separate_async":
        raise ValueError(
            f"tba.searcher_queue_prompts needs trainer.v1.trainer_mode=tba_separate_async (decoupled "
            f"searchers), got {mode}"
        )
    chunk = dataloader_fetch(cfg["data"])
    if queue < chunk:
        raise ValueError(
            f"tba.searcher_queue_prompts={queue} is below one dataloader fetch of {chunk} prompts "
            "(data.gen_batch_size, else data.train_batch_size): nothing could be queued"
        )


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
        return False, (
            "Megatron actor: verl's three-call update (old log-probs, advantage, update); the fused "
            "update needs the FSDP engine's force_group_size micro-batching"
        )
    prefix = "actor_rollout_ref.actor."
    if float(actor.get("entropy_coeff") or 0.0) != 0.0:
        raise ValueError(
            f"{prefix}entropy_coeff={actor['entropy_coeff']}: the fused TB update has no entropy term; set it to 0 "
            "(or tba.fused_update=false for verl's three-call update with its entropy bonus)"
        )
    if actor.get("shuffle", False):
        raise ValueError(
            f"{prefix}shuffle=True splits prompt groups across mini-batches; the fused TB update takes "
            "log Z from whole groups: set it to False (or tba.fused_update=false)"
        )
    if actor.get("use_dynamic_bsz", False):
        data = cfg["data"]
        group_tokens = n * (int(data["max_prompt_length"]) + int(data["max_response_length"]))
        if int(actor.get("ppo_max_token_len_per_gpu") or 0) < group_tokens:
            raise ValueError(
                f"{prefix}ppo_max_token_len_per_gpu={actor.get('ppo_max_token_len_per_gpu')} cannot "
                f"hold one prompt group of rollout.n={n} at full length ({group_tokens} tokens); the "
                "fused TB update keeps groups whole per micro-batch: raise it"
            )
    else:
        micro = actor.get("ppo_micro_batch_size_per_gpu")
        if micro is None or int(micro) % n:
            raise ValueError(
                f"{prefix}ppo_micro_batch_size_per_gpu={micro} must be a multiple of rollout.n={n}: the "
                "fused TB update keeps prompt groups whole per micro-batch"
            )
    trainer = cfg["trainer"]
    dp = int(trainer.get("n_gpus_per_node", 1)) * int(trainer.get("nnodes", 1))
    dp //= int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    k = local_updates(cfg) if is_tba_mode(trainer.get("v1", {}).get("trainer_mode")) else 1
    per_update = int(cfg["data"]["train_batch_size"]) // k
    if per_update % dp or int(actor["ppo_mini_batch_size"]) % dp:
        raise ValueError(
            f"data.train_batch_size / k = {per_update} and {prefix}ppo_mini_batch_size="
            f"{actor['ppo_mini_batch_size']} prompts must be multiples of the {dp} data-parallel "
            "ranks: the fused TB update gives each rank whole prompt groups"
        )
    return True, "fused"


def check_tba_run(cfg: Mapping[str, Any]) -> tuple[TBASettings, ReplaySettings | None]:
    """Every start-up check of a run (full verl config as nested dicts): the ``tba:`` node, the TB estimator,
    the replay sampler, reference updates, free-running searchers and the fused update. Returns the parsed settings."""
    settings = parse_settings(cfg.get("tba"))
    check_verl_values(cfg)
    check_tb_run(cfg)
    replay = check_replay_run(cfg)
    check_reference_updates(cfg, settings)
    check_searcher_queue(cfg, settings)
    check_lr_schedule(cfg, settings)
    fused_update_plan(cfg, settings)
    return settings, replay


def planned_epochs(cfg: Mapping[str, Any], rows: int, rows_from: str = "data.train_files") -> tuple[int, int]:
    """(global steps per epoch, ``trainer.total_epochs``) under which verl's V1 loop runs the planned
    ``trainer.total_training_steps`` over ``rows`` training prompts; the tba_* trainer modes set both
    (``adapters.trainer``). verl counts rows // data.train_batch_size steps an epoch, divides by it, and stops after
    trainer.total_epochs of them whatever trainer.total_training_steps says. Refuses, naming the keys, a dataset
    whose dataloader could not serve a step, and a run length verl would derive from no whole batch."""
    data, trainer = cfg["data"], cfg["trainer"]
    batch, steps = int(data["train_batch_size"]), trainer.get("total_training_steps")
    fetch = verl_dataloader_fetch(cfg)
    if rows < fetch:
        raise ValueError(
            f"{rows_from}: {rows} training prompts, fewer than one dataloader fetch of {fetch} "
            "(data.gen_batch_size, else data.train_batch_size; verl drops a short fetch), so no step could draw its "
            f"prompts: give at least {fetch} prompts (those data.filter_overlong_prompts keeps) or lower "
            "data.train_batch_size"
        )
    if rows < batch and steps is None:
        raise ValueError(
            f"trainer.total_training_steps is null, so verl makes the run trainer.total_epochs x whole batches of "
            f"data.train_batch_size={batch} in {rows_from}' {rows} training prompts: none; set "
            "trainer.total_training_steps"
        )
    per_epoch = steps_per_epoch(rows, batch)
    return per_epoch, epochs_for_steps(steps, int(trainer["total_epochs"]), per_epoch)


def check_planned_steps(cfg: Mapping[str, Any], rows: int, rows_from: str = "data.train_files") -> None:
    """``planned_epochs``' refusals; under verl's own trainer modes, which keep verl's count, also a run verl's
    loop would divide by zero or cut short of ``trainer.total_training_steps``. ``rows_from`` names the rows."""
    per_epoch, epochs = planned_epochs(cfg, rows, rows_from)
    trainer = cfg["trainer"]
    if uses_replay_sampler(cfg):
        kwargs = trainer["v1"]["sampler"].get("sampler_kwargs") or {}
        min_buffer = kwargs.get("min_buffer_groups")
        # the store counts distinct prompts (generations with staleness_mix, which a repeated prompt can fill)
        if isinstance(min_buffer, int) and min_buffer > rows and not kwargs.get("staleness_mix"):
            raise ValueError(
                f"{SAMPLER_KWARGS}min_buffer_groups={min_buffer} distinct prompts can never be stored from {rows} "
                f"training prompts ({rows_from}): lower it or give more prompts"
            )
    mode = str(trainer["v1"].get("trainer_mode", "sync"))
    if is_tba_mode(mode):
        return
    batch = int(cfg["data"]["train_batch_size"])
    if rows < batch:
        raise ValueError(
            f"trainer.v1.trainer_mode={mode} (verl's own) counts {rows} training prompts ({rows_from}) // "
            "data.train_batch_size="
            f"{batch} = 0 global steps an epoch and divides by it: give at least {batch} prompts, lower "
            "data.train_batch_size or run a tba_* trainer mode"
        )
    if epochs != int(trainer["total_epochs"]):
        raise ValueError(
            f"trainer.v1.trainer_mode={mode} (verl's own) stops after trainer.total_epochs={trainer['total_epochs']}"
            f" x {per_epoch} global steps ({rows} training prompts // data.train_batch_size={batch}), short of "
            f"trainer.total_training_steps={trainer['total_training_steps']}: set trainer.total_epochs={epochs}"
        )


def check_lr_schedule(cfg: Mapping[str, Any], settings: TBASettings) -> None:
    """``tba.lr_schedule`` replaces the actor's scheduler in its FSDP engine; verl's own warmup and schedule
    would be silently overridden, so they must be left at their defaults."""
    if settings.lr_schedule.name is None:
        return
    actor = cfg["actor_rollout_ref"]["actor"]
    if actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"tba.lr_schedule replaces the FSDP engine's scheduler; actor_rollout_ref.actor.strategy="
            f"{actor.get('strategy')} keeps its own: set tba.lr_schedule.name=null"
        )
    optim = actor.get("optim") or {}
    if (
        optim.get("lr_scheduler_type", "constant") != "constant"
        or (optim.get("lr_warmup_steps") or -1) > 0
        or (optim.get("lr_warmup_steps_ratio") or 0.0) > 0
    ):
        raise ValueError(
            "tba.lr_schedule sets the warmup and decay itself: leave actor_rollout_ref.actor.optim."
            "lr_scheduler_type=constant with no lr_warmup_steps / lr_warmup_steps_ratio"
        )


def check_tb_pg_importance_weights(
    correction: Mapping[str, Any], policy_loss: Mapping[str, Any], rollout: Mapping[str, Any]
) -> None:
    """TBA' weights each token by min(pi_theta / pi_rollout, is_ratio_max). verl supplies pi_old / pi_rollout
    (``rollout_is_weights``, from the searcher's log-probs) when token-level rollout IS is on; the loss
    multiplies it by pi_theta / pi_old and clamps. verl's own truncation must not bite first."""
    prefix = "algorithm.rollout_correction."
    if correction.get("rollout_is") != "token":
        raise ValueError(
            f"tb_pg weights tokens by pi_theta / pi_rollout: set {prefix}rollout_is=token "
            f"(got {correction.get('rollout_is')}); verl then passes pi_old / pi_rollout to the loss"
        )
    is_ratio_max = checked_is_ratio_max(
        checked_type(policy_loss.get("is_ratio_max", IS_RATIO_MAX), "float", IS_RATIO_MAX_KEY)
    )
    threshold = correction.get("rollout_is_threshold", 2.0)
    number = threshold
    if isinstance(threshold, str) and "_" not in threshold:  # YAML reads 1e6 as a string
        with contextlib.suppress(ValueError):
            number = float(threshold)
    if isinstance(number, bool) or not isinstance(number, int | float) or not number >= 1e3 * is_ratio_max:
        raise ValueError(
            f"tb_pg clamps the whole ratio at actor_rollout_ref.actor.policy_loss.is_ratio_max="
            f"{is_ratio_max}; verl's truncation {prefix}rollout_is_threshold={threshold} would clip "
            f"pi_old / pi_rollout first: set it to 1e6 (or above 1000 * is_ratio_max)"
        )
    if correction.get("rollout_is_batch_normalize", False):
        raise ValueError(f"tb_pg needs the raw ratio: set {prefix}rollout_is_batch_normalize=False")
    if not rollout.get("calculate_log_probs", False):
        raise ValueError("tb_pg needs the searcher's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True")


def uses_replay_sampler(cfg: Mapping[str, Any]) -> bool:
    """Whether a full verl config (nested dicts or a DictConfig) selects tba-ext's replay sampler."""
    sampler = ((cfg.get("trainer") or {}).get("v1") or {}).get("sampler") or {}
    return (sampler.get("custom_sampler") or {}).get("name") == REPLAY_SAMPLER_NAME


def check_replay_run(cfg: Mapping[str, Any]) -> ReplaySettings | None:
    """The replay settings of a full verl config (None without the replay sampler), checked against verl's
    own keys: the trainer draws K = rollout.n of the S = samples_per_prompt generated per prompt."""
    n = int(cfg["actor_rollout_ref"]["rollout"].get("n", 1))
    if not uses_replay_sampler(cfg):
        return None
    settings = parse_replay_settings(cfg["trainer"]["v1"]["sampler"].get("sampler_kwargs"), SAMPLER_KWARGS)
    s = settings.samples_per_prompt
    if s is not None and s < n:
        raise ValueError(
            f"{SAMPLER_KWARGS}samples_per_prompt={s} is S, generated per prompt; it must be >= "
            f"actor_rollout_ref.rollout.n={n}, the K the trainer draws per group"
        )
    mode = cfg["trainer"]["v1"].get("trainer_mode", "sync")
    if s is not None and s > n and not is_tba_mode(mode):
        raise ValueError(
            f"{SAMPLER_KWARGS}samples_per_prompt={s} > rollout.n needs a tba_* trainer mode (it asks "
            f"the searchers for S samples per prompt); trainer.v1.trainer_mode is {mode}"
        )
    k = local_updates(cfg) if is_tba_mode(mode) else 1
    if settings.max_staleness is not None and settings.max_staleness < k - 1:
        raise ValueError(
            f"{SAMPLER_KWARGS}max_staleness={settings.max_staleness}: decoupled searchers hold weights "
            f"up to k - 1 = {k - 1} updates older than the trainer's at local updates 2..k "
            f"(trainer.v1.separate_async.parameter_sync_step={k}), so no batch could be served; set it "
            f">= {k - 1}"
        )
    if (s or n) > settings.per_prompt_capacity:
        raise ValueError(
            f"{SAMPLER_KWARGS}per_prompt_capacity={settings.per_prompt_capacity} cannot hold one "
            f"generation of {s or n} samples per prompt; raise it"
        )
    return settings
