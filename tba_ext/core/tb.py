"""Trajectory balance (VarGrad TB) for language models: the equations of TBA, framework-free.

Paper: Bartoldson et al., "Trajectory Balance with Asynchrony" (arXiv 2503.18929), eq. 5 and App. A.
Nothing here imports verl; the verl adapters in ``tba_ext.adapters`` translate verl tensors into these calls.

Notation (one prompt group i with K responses j):
    l_theta(y) = sum_t log pi_theta(y_t | x, y_<t)     (sequence log-prob, no length normalisation)
    delta_ij   = l_theta(y_ij) - l_ref(y_ij) - r_ij / beta
    log Z_i    = -stopgrad(mean_j delta_ij)
    L          = mean_i mean_j (log Z_i + delta_ij)^2   (eq. 5: the within-group variance of delta)
"""

from __future__ import annotations

import numpy as np
import torch


def sequence_logprob(token_logprob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of per-token log-probs over valid response tokens: (B, T) -> (B,)."""
    return (token_logprob * response_mask.to(token_logprob.dtype)).sum(-1)


def spread_over_tokens(per_sequence: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence loss (B,) spread evenly over each sequence's valid tokens (B, T), so that a token sum per
    sequence (verl's ``seq-mean-token-sum``) gives it back exactly."""
    mask = response_mask.to(per_sequence.dtype)
    return per_sequence.unsqueeze(-1) * mask / mask.sum(-1, keepdim=True).clamp(min=1.0)


def group_ids(uids) -> torch.Tensor:
    """Map an array of prompt uids (any hashable) to dense integer group ids, in first-seen order (host side)."""
    index: dict = {}
    return torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)


def first_member(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group as the row index of its group's first member, and its group's size, for integer group
    ``labels`` of one (micro-)batch: ids below ``len(labels)`` for ``group_mean(..., n_groups=len(labels))``,
    computed on the labels' device without a host round trip (a (B, B) comparison; B is a micro-batch)."""
    same = labels[:, None] == labels[None, :]
    rows = torch.arange(labels.shape[0], device=labels.device)
    return torch.where(same, rows, labels.shape[0]).amin(-1), same.sum(-1)


def group_mean(values: torch.Tensor, groups: torch.Tensor, n_groups: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the members of each element's group, broadcast back to every element.

    ``groups``: ids below ``n_groups``, on the values' device; ``n_groups=None`` reads it from ``groups`` (a host
    round trip where they live on an accelerator)."""
    if n_groups is None:
        n_groups = int(groups.max().item()) + 1 if groups.numel() else 0
    sums = values.new_zeros(n_groups).index_add_(0, groups, values)
    counts = values.new_zeros(n_groups).index_add_(0, groups, torch.ones_like(values))
    return (sums / counts.clamp(min=1.0))[groups]


def tb_advantage(
    score: torch.Tensor, groups: torch.Tensor, beta: float, pg_units: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-centred KL-regularised advantage of TB (App. A), in units of 1/beta, with its statistics.

    ``score`` is S = r - beta * kl per trajectory (kl = l_old - l_ref, the k1 sequence KL at the step-start
    policy: verl's KL-in-reward token rewards summed over the response). Then
        A = (S - mean_group S) / beta = (r - r_bar) / beta - (kl - kl_bar)
    and ``tb_loss_from_advantage`` equals eq. 5 with log Z fixed at its step-start VarGrad estimate
    log Z_i = -mean_j delta_ij = mean_j S_ij / beta. ``pg_units`` returns beta * A, the TBA' policy-gradient
    advantage (r - r_bar) - beta (kl - kl_bar). Statistics: ``log_z`` (mean over trajectories of log Z_i) and
    ``mean_abs_advantage``. A group of one trajectory has no variance to balance and is refused.
    """
    if not score.numel():  # a batch of padding rows only
        return score, {"log_z": 0.0, "mean_abs_advantage": 0.0}
    if (torch.bincount(groups) == 1).any():
        raise ValueError(
            "TB needs at least 2 responses per prompt group (actor_rollout_ref.rollout.n >= 2); "
            "found a group with one response"
        )
    group_score = group_mean(score, groups)
    advantage = (score - group_score) / (1.0 if pg_units else beta)
    log_z = float((group_score / beta).mean()) if beta > 0 else float("nan")  # no log Z without KL (TBA′, beta 0)
    return advantage, {"log_z": log_z, "mean_abs_advantage": float(advantage.abs().mean())}


def tb_loss_from_advantage(
    policy_seq_logprob: torch.Tensor, old_seq_logprob: torch.Tensor, advantage: torch.Tensor
) -> torch.Tensor:
    """Per-sequence TB loss in advantage form: (l_theta - l_old - A)^2, shape (B,).

    Equals (log Z_old + delta(theta))^2 of eq. 5 with log Z_i = -mean_j delta_ij(old): at theta = old the
    value and gradient match the direct VarGrad loss exactly; the gradient there is -2 A grad l_theta,
    mean-baseline REINFORCE on the KL-regularised reward (App. A).
    """
    return (policy_seq_logprob - old_seq_logprob - advantage) ** 2


def vargrad_tb_loss(
    policy_seq_logprob: torch.Tensor,
    ref_seq_logprob: torch.Tensor,
    reward: torch.Tensor,
    groups: torch.Tensor,
    beta: float,
    n_groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5 per trajectory, from one forward pass: (log Z_i + delta_ij)^2, shape (B,), and log Z_i per row.

    delta_ij = l_theta(y_ij) - l_ref(y_ij) - r_ij / beta and log Z_i = -stopgrad(mean_j delta_ij), the group
    mean of the same forward (reference code, tba_trainer_gsm8k.py:692-707), so the loss is exact at every
    update, not only at the policy that started the step. ``groups`` must hold every member of each group.
    """
    delta = policy_seq_logprob - ref_seq_logprob - reward / beta
    log_z = -group_mean(delta.detach(), groups, n_groups)
    return (log_z + delta) ** 2, log_z


def tb_pg_advantage(
    policy_seq_logprob: torch.Tensor,
    ref_seq_logprob: torch.Tensor,
    reward: torch.Tensor,
    groups: torch.Tensor,
    beta: float,
    n_groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TBA' advantage from one forward pass: (r - r_bar) - beta (kl - kl_bar), kl = sg(l_theta) - l_ref, shape (B,),
    and log Z_i = mean_j S_ij / beta per row (S = r - beta kl, as ``tb_advantage`` reports it; NaN at beta = 0,
    where the advantage is the plain group-centred reward r - r_bar and no log Z exists).

    beta times the TB advantage at the policy being trained; it is minus beta times the centred delta of eq. 5,
    so its policy gradient is eq. 5's gradient (App. A). Detached: it weights the gradient.
    """
    score = (reward - beta * (policy_seq_logprob - ref_seq_logprob)).detach()
    group_score = group_mean(score, groups, n_groups)
    log_z = group_score / beta if beta > 0 else torch.full_like(group_score, float("nan"))
    return score - group_score, log_z


def rollout_ratio(
    token_logprob: torch.Tensor, old_token_logprob: torch.Tensor, old_over_rollout: torch.Tensor
) -> torch.Tensor:
    """pi_theta / pi_rollout per token, against the policy that generated the trajectory (the searcher's, which
    may be several updates stale): pi_theta / pi_old x pi_old / pi_rollout, the second factor being verl's rollout
    importance weight from the searcher's own log-probs. Detached: it weights the gradient, it is not one."""
    return (torch.exp(token_logprob - old_token_logprob) * old_over_rollout).detach()


def tb_pg_loss_matrix(
    token_logprob: torch.Tensor, advantage: torch.Tensor, ratio: torch.Tensor, is_ratio_max: float
) -> torch.Tensor:
    """TBA' per-token loss (paper section 6, PRIME-RL form): -sg(min(ratio, is_ratio_max)) * A * log pi_theta.

    ``ratio`` is pi_theta / pi_rollout per token, against the policy that generated the trajectory; clamping
    it from above (CISPO-style, 8 in the paper's runs) bounds the weight of very stale tokens. Shape (B, T).
    """
    return -torch.clamp(ratio.detach(), max=is_ratio_max) * advantage * token_logprob


def ratio_stats(ratio: torch.Tensor, mask: torch.Tensor, is_ratio_max: float) -> dict[str, torch.Tensor]:
    """Statistics of TBA''s per-token ratio pi_theta / pi_rollout over the response tokens (``mask``): the share
    clamped at ``is_ratio_max``, the mean and the max. 0-dim tensors on the ratio's device."""
    tokens = mask.sum().clamp(min=1.0)
    return {
        "is_ratio_clipfrac": ((ratio > is_ratio_max).to(mask.dtype) * mask).sum() / tokens,
        "ratio_mean": (ratio * mask).sum() / tokens,
        "ratio_max": (ratio * mask).max(),
    }


def beta_at_step(step: int, beta_init: float, beta_final: float | None, anneal_steps: int) -> float:
    """Linear beta anneal of the paper's GSM8K runs (reference code, tba_trainer_gsm8k.py:657-662).

    beta_u = beta_final * (u - 1) / N + beta_init * (1 - (u - 1) / N) for u < N, else beta_final; u is the
    optimizer update, counted from 1. ``beta_final=None`` or ``anneal_steps=0`` means a constant beta_init.
    """
    if beta_final is None or anneal_steps <= 0:
        return float(beta_init)
    if step >= anneal_steps:
        return float(beta_final)
    frac = max(step - 1, 0) / anneal_steps
    return float(beta_final * frac + beta_init * (1.0 - frac))


def wsd_lr_ratio(
    updates_done: int, warmup: int, stable: int, decay: int, min_ratio: float = 0.0, decay_shape: str = "cosine"
) -> float:
    """Warmup-stable-decay learning-rate factor after ``updates_done`` optimizer updates (the reference code's
    ``lr_scheduler_type=warmup_stable_decay``, HF's ``get_wsd_schedule``): linear from min_ratio to 1 over
    ``warmup``, 1 for ``stable``, then down to min_ratio over ``decay``: min_ratio + (1 - min_ratio) d(p) with p the
    fraction of ``decay`` done, d = (1 + cos(pi p)) / 2 (cosine) or 1 - p (linear); min_ratio after it. HF's
    ``linear`` schedule without warmup (TRL's default) is warmup = stable = 0 with a linear decay."""
    if updates_done < warmup:
        return min_ratio + (1.0 - min_ratio) * updates_done / max(1, warmup)
    if updates_done < warmup + stable:
        return 1.0
    if updates_done < warmup + stable + decay:
        progress = (updates_done - warmup - stable) / decay
        shape = 0.5 * (1.0 + float(np.cos(np.pi * progress))) if decay_shape == "cosine" else 1.0 - progress
        return min_ratio + (1.0 - min_ratio) * shape
    return min_ratio


def first_update(global_step: int, updates_per_step: int) -> int:
    """The optimizer update (from 1) that opens verl global step ``global_step`` (from 1)."""
    return (max(global_step, 1) - 1) * updates_per_step + 1


def multiples_passed(before: int, after: int, every: int) -> int:
    """How many multiples of ``every`` lie in (before, after]: the resets due when the update count moves
    from ``before`` to ``after``."""
    return after // every - before // every if every > 0 else 0


def zero_variance_fraction(reward: np.ndarray, uids) -> float:
    """Fraction of prompt groups whose rewards are all equal (TB and GRPO get no reward signal from them)."""
    by_group: dict = {}
    for u, r in zip(uids, np.asarray(reward, dtype=float)):
        by_group.setdefault(u, []).append(r)
    if not by_group:
        return 0.0
    return float(np.mean([np.ptp(v) == 0 for v in by_group.values()]))
