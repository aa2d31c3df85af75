"""verl registrations of the TB objective: one decorated function per loss and per estimator.

Each function translates verl's padded (B, T) tensors into a call of ``tba_ext.core.tb``.

- ``algorithm.adv_estimator=tb`` returns A = (S - mean_group S) / beta, with S the sum of verl's
  ``token_level_rewards`` = r - beta * sum_t (old_log_prob - ref_log_prob) (``use_kl_in_reward=True``,
  ``kl_penalty=kl``) and beta read from the same KL coefficient, so both always move together.
- ``policy_loss.loss_mode=tb`` is (l_theta - l_old - A)^2 per sequence: eq. 5 with log Z fixed at its
  step-start estimate. log Z is a per-group constant computed before the update, so micro-batches and
  data-parallel ranks never need to hold whole groups.
- ``adv_estimator=tb_pg`` / ``loss_mode=tb_pg`` are the TBA' form: advantage beta * A applied as a
  policy gradient with a detached importance ratio clamped at ``is_ratio_max``.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_adv_est, register_policy_loss

from tba_ext.core import tb
from tba_ext.core.settings import IS_RATIO_MAX, TB_MODES, checked_beta


def _kl_coef(config, pg_units: bool) -> float:
    return checked_beta(config.kl_ctrl.kl_coef, allow_zero=pg_units)


def _sequence_advantage(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """verl broadcasts a sequence advantage over its tokens; recover it as the masked mean."""
    mask = response_mask.to(advantages.dtype)
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def _tb_estimator(token_level_rewards, response_mask, index, config, pg_units: bool):
    """Unpack verl's (B, T) KL-in-reward token rewards into per-trajectory scores S = r - beta * KL and make the
    core call; the sequence advantage is broadcast back over the response tokens."""
    beta = _kl_coef(config, pg_units)
    if index is None:
        raise ValueError("the tb estimators need prompt uids (verl's 'uid' field) to form groups")
    mask = response_mask.to(token_level_rewards.dtype)
    # verl pads a batch to a multiple of the data-parallel size with no-op rows (empty response mask, one
    # shared uid): they get advantage 0 and stay out of the statistics
    real = mask.sum(-1) > 0
    groups = tb.group_ids([uid for uid, keep in zip(index, real.tolist()) if keep])
    advantage, _ = tb.tb_advantage((token_level_rewards * mask).sum(-1)[real], groups, beta, pg_units)
    seq_adv = torch.zeros(mask.shape[0], dtype=mask.dtype, device=mask.device)
    seq_adv[real] = advantage
    return seq_adv.unsqueeze(-1) * mask


@register_adv_est("tb")
def compute_tb_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_ij = (S_ij - mean_j S_ij) / beta, broadcast over response tokens. Returns (advantages, returns)."""
    adv = _tb_estimator(token_level_rewards, response_mask, index, config, pg_units=False)
    return adv, adv


@register_adv_est("tb_pg")
def compute_tb_pg_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """TBA' advantage (r - r_bar) - beta (KL - KL_bar) = beta * A_tb, broadcast over response tokens."""
    adv = _tb_estimator(token_level_rewards, response_mask, index, config, pg_units=True)
    return adv, adv


def _loss_field(config, name: str, default: float) -> float:
    policy_loss = getattr(config, "policy_loss", None)
    return float(getattr(policy_loss, name, default)) if policy_loss is not None else default


def is_ratio_max(config) -> float:
    """TBA′'s clamp of pi_theta / pi_rollout from the actor config (checked where the config is read)."""
    return _loss_field(config, "is_ratio_max", IS_RATIO_MAX)


def aggregate(loss_mat, mask, loss_agg_mode: str, config) -> torch.Tensor:
    """verl's agg_loss over the global batch (``global_batch_info``: exact across micro-batches and ranks),
    times the configured ``loss_scale``."""
    global_batch_info = getattr(config, "global_batch_info", None) or {}
    return agg_loss(loss_mat, mask, loss_agg_mode, **global_batch_info) * _loss_field(config, "loss_scale", 1.0)


@register_policy_loss("tb")
def compute_policy_loss_tb(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """VarGrad TB in advantage form: mean over sequences of (sum_t (log_prob - old_log_prob) - A)^2.

    Args: (B, T) tensors as every verl policy loss; ``advantages`` come from ``adv_estimator=tb``.
    TB is defined per sequence, so aggregation is always a sequence mean over the global batch
    (``loss_agg_mode`` is ignored); verl's ``global_batch_info`` keeps it exact across micro-batches
    and data-parallel ranks. No clipping, no importance weights (the paper's off-policy claim).
    """
    mask = response_mask.to(log_prob.dtype)
    seq_adv = _sequence_advantage(advantages, mask)
    per_seq = tb.tb_loss_from_advantage(
        tb.sequence_logprob(log_prob, mask), tb.sequence_logprob(old_log_prob, mask), seq_adv
    )
    loss = aggregate(tb.spread_over_tokens(per_seq, mask), mask, "seq-mean-token-sum", config)
    metrics = {
        "tb/residual_var": per_seq.detach().mean(),
        "tb/policy_log_ratio": tb.sequence_logprob(log_prob - old_log_prob, mask).detach().mean(),
    }  # 0-dim tensors on the loss's device: verl's Metric reads them back
    return loss, metrics


@register_policy_loss("tb_pg")
def compute_policy_loss_tb_pg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum-norm",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """TBA' (the paper's 7B form): -sg(min(pi_theta / pi_rollout, is_ratio_max)) * A * log pi_theta per token.

    ``advantages`` come from ``adv_estimator=tb_pg``; ``rollout_is_weights`` is verl's pi_old / pi_rollout
    from the searcher's log-probs (``algorithm.rollout_correction.rollout_is=token``, no truncation), so
    ratio = pi_theta / pi_old * pi_old / pi_rollout is taken against the policy that generated the trajectory.
    Aggregated with the configured ``loss_agg_mode`` (Dr. GRPO's ``seq-mean-token-sum-norm`` in our configs).
    """
    if rollout_is_weights is None:
        raise ValueError(
            "tb_pg needs verl's rollout IS weights: set algorithm.rollout_correction.rollout_is=token "
            "and actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    mask = response_mask.to(log_prob.dtype)
    clamp = is_ratio_max(config)
    ratio = tb.rollout_ratio(log_prob, old_log_prob, rollout_is_weights)
    loss_mat = tb.tb_pg_loss_matrix(log_prob, advantages, ratio, clamp)
    loss = aggregate(loss_mat, mask, loss_agg_mode, config)
    # 0-dim tensors on the loss's device: verl's Metric reads them back
    return loss, {f"tb_pg/{k}": v for k, v in tb.ratio_stats(ratio, mask, clamp).items()}


LOSS_NAMES = ESTIMATOR_NAMES = TB_MODES
