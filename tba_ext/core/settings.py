"""Typed TBA settings (the ``tba:`` config node) and the start-up checks of a TB run. No verl import.

Every refusal names the config key to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional


@dataclass
class BetaSchedule:
    """beta (= verl's ``algorithm.kl_ctrl.kl_coef`` at step 1) annealed linearly to ``final``.

    ``final=None`` keeps beta constant. The paper's GSM8K run: kl_coef 0.014 -> final 0.004 over 500 steps.
    """

    final: Optional[float] = None
    anneal_steps: int = 0


@dataclass
class ReplaySettings:
    """The TBA replay buffer and its sampler (reference spec section 2; defaults = the paper's GSM8K).

    Lives in verl's ``trainer.v1.sampler.sampler_kwargs`` (verl's free-form dict for custom samplers)."""

    recency_prob: float = 0.95  # m: probability a group comes from the freshest weight versions
    reward_inv_temp: float = 0.0  # softmax(inv_temp * reward) prompt weights; 0 = uniform (GSM8K)
    reward_mix: float = 1.0  # weight of the softmax term vs uniform in the replay branch
    per_prompt_capacity: int = 100
    capacity: int = 100_000  # global cap in trajectories
    max_staleness: Optional[int] = None  # weight versions; None = no cap
    recency_window: int = 1  # versions counted as "freshest" (k in the decoupled mode)
    max_nonfinite_frac: float = 0.05  # stop the run when more rewards than this are NaN/inf
    min_fresh_groups: int = 0  # finished fresh groups to wait for before each sample; 0 = the batch size
    seed: int = 0


@dataclass
class TBASettings:
    beta: BetaSchedule = field(default_factory=BetaSchedule)
    ref_reset_every: int = 0  # rho: copy the policy into the reference every rho steps (TBA'); 0 = never


def _build(cls, node: Mapping[str, Any] | None, prefix: str):
    node = dict(node or {})
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(node) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(prefix + k for k in unknown)}; known: {sorted(known)}")
    kwargs = {}
    for name, value in node.items():
        sub = {"beta": BetaSchedule}.get(name) if cls is TBASettings else None
        kwargs[name] = _build(sub, value, f"{prefix}{name}.") if sub else value
    return cls(**kwargs)


def parse_replay_settings(node: Mapping[str, Any] | None, prefix: str) -> ReplaySettings:
    """ReplaySettings from a dict (verl's ``trainer.v1.sampler.sampler_kwargs``), with range checks."""
    r = _build(ReplaySettings, node, prefix)
    checks = [
        (0.0 <= r.recency_prob <= 1.0, "recency_prob must be in [0, 1]", r.recency_prob),
        (0.0 <= r.reward_mix <= 1.0, "reward_mix must be in [0, 1]", r.reward_mix),
        (r.per_prompt_capacity > 0, "per_prompt_capacity must be > 0", r.per_prompt_capacity),
        (r.capacity > 0, "capacity must be > 0", r.capacity),
        (r.max_staleness is None or r.max_staleness >= 0, "max_staleness must be >= 0 or null", r.max_staleness),
        (r.recency_window >= 1, "recency_window must be >= 1", r.recency_window),
        (0.0 <= r.max_nonfinite_frac <= 1.0, "max_nonfinite_frac must be in [0, 1]", r.max_nonfinite_frac),
        (r.min_fresh_groups >= 0, "min_fresh_groups must be >= 0", r.min_fresh_groups),
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
        (settings.beta.anneal_steps >= 0, "tba.beta.anneal_steps must be >= 0", settings.beta.anneal_steps),
        (settings.beta.final is None or settings.beta.final > 0, "tba.beta.final must be > 0 or null",
         settings.beta.final),
    ]
    for ok, message, value in checks:
        if not ok:
            raise ValueError(f"{message}, got {value}")
    return settings


def check_tb_run(cfg: Mapping[str, Any]) -> None:
    """Refuse verl settings that break the TB estimator. ``cfg`` is the full verl config as nested dicts."""
    algo = cfg["algorithm"]
    actor = cfg["actor_rollout_ref"]["actor"]
    rollout = cfg["actor_rollout_ref"]["rollout"]
    estimator = algo.get("adv_estimator")
    loss_mode = actor.get("policy_loss", {}).get("loss_mode")
    tb_estimator = estimator in ("tb", "tb_pg")
    if loss_mode in ("tb", "tb_pg") and estimator != loss_mode:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} needs algorithm.adv_estimator={loss_mode}, "
            f"got {estimator}"
        )
    if not tb_estimator:
        return
    beta = algo.get("kl_ctrl", {}).get("kl_coef")
    if beta is None or not float(beta) > 0:
        raise ValueError(f"algorithm.kl_ctrl.kl_coef is TB's beta and must be > 0, got {beta}")
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
    if actor.get("use_kl_loss", False):
        raise ValueError("TB carries its KL term in the reward: set actor_rollout_ref.actor.use_kl_loss=False")
