"""The fused TB / TBA' update: the loss from one forward + backward per micro-batch, as the paper's trainer does.

verl's pipeline computes old log-probs (a forward pass), reference log-probs (another), the advantage on the
driver, then the update (forward + backward). TB needs neither the old log-probs nor a driver-side advantage:
log Z is the detached group mean of the training forward itself (``tba_ext.core.tb.vargrad_tb_loss``), so every
micro-batch must hold whole prompt groups. The trainer makes that true (``TBATrainerMixin._balance_batch`` puts
whole groups on each data-parallel rank, ``force_group_size`` keeps them whole in verl's micro-batching) and
``fused_tb_loss`` below replaces verl's ``ppo_loss`` on the actor workers. Fields it reads from each micro-batch:
``response_mask``, ``rm_scores`` (the reward), ``ref_log_prob``, ``tba_group`` (dense group index written by the
trainer), ``rollout_log_probs`` (TBA' only); beta and the loss mode come as the batch's ``tba_beta`` /
``tba_loss_mode``.
"""

from __future__ import annotations

import functools

import torch
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.padding import no_padding_2_padding

from tba_ext.adapters.losses import aggregate
from tba_ext.core import tb
from tba_ext.core.settings import IS_RATIO_MAX
from tba_ext.core.wire import BAD_GROUPS_METRIC, BETA_KEY, GROUP_FIELD, GROUP_SIZE_KEY, MODE_KEY

# statistics of the batch that the three-call path computes on the driver (tb/*); the trainer moves them out of
# verl's actor/ namespace, where the rest of the loss's metrics stay (actor/tb/residual_var, actor/tb_pg/*)
BATCH_METRICS = ("tb/kl", "tb/log_z", "tb/mean_abs_advantage")


def _global_batch_info(config, data) -> dict:
    """verl's normalisation over the global batch (as its ppo_loss sets it): exact across micro-batches and
    data-parallel ranks."""
    config.global_batch_info["dp_size"] = data["dp_size"]
    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    return config.global_batch_info


def _refuse_unhonoured(config, mode) -> None:
    """What the fused loss cannot honour, refused where a config got past the start-up checks (``checks``)."""
    prefix = "actor_rollout_ref.actor."
    if float(getattr(config, "entropy_coeff", 0.0) or 0.0) != 0.0:
        raise RuntimeError(
            f"tba-ext fused update: {prefix}entropy_coeff={config.entropy_coeff} has no term in the fused TB loss; "
            "set it to 0 (or tba.fused_update=false for verl's entropy bonus)"
        )
    if mode == "tb_pg" and config.loss_agg_mode == "seq-mean-token-sum-norm" and config.loss_scale_factor is None:
        raise RuntimeError(
            f"tba-ext fused update: {prefix}loss_agg_mode=seq-mean-token-sum-norm with {prefix}loss_scale_factor "
            "unset divides each micro-batch by its own padded length; set it (data.max_response_length)"
        )


def fused_terms(config, log_prob, padded, beta: float, mode: str, group_size: int):
    """The fused loss of one micro-batch and its metrics, as tensors on the forward's device: verl's engine moves
    the micro-batch to the accelerator before the loss, so nothing here reads a value back to the host.

    ``log_prob`` (B, T) from the forward; ``padded``: the micro-batch's fields as (B, T) / (B,) tensors.
    tb: mean over trajectories of (log Z_i + delta_ij)^2 (eq. 5), log Z_i the detached group mean of delta.
    tb_pg: -sg(min(pi_theta / pi_rollout, is_ratio_max)) * A * log pi_theta, A = (r - r_bar) - beta (kl - kl_bar)
    at this forward, aggregated with ``loss_agg_mode``. The metrics include ``BAD_GROUPS_METRIC``: 1 where a group of
    the micro-batch does not hold exactly ``group_size`` (rollout.n) rows.
    """
    # sequence sums in float32: a bf16 forward's log-probs summed in bf16 (CPU autocast does not promote sum) put
    # the TB loss a quarter off; the cast is (B, T), against the model's forward
    log_prob = log_prob.float()
    mask = padded["response_mask"].to(log_prob.dtype)
    groups, sizes = tb.first_member(padded[GROUP_FIELD].to(log_prob.device))
    n_rows = groups.shape[0]
    policy = tb.sequence_logprob(log_prob, mask)
    ref = tb.sequence_logprob(padded["ref_log_prob"].to(log_prob.dtype), mask)
    reward = tb.sequence_logprob(padded["rm_scores"].to(log_prob.dtype), mask)
    tokens = mask.sum(-1).clamp(min=1.0)
    stats = {
        BAD_GROUPS_METRIC: (sizes != group_size).any(),
        "tb/kl": ((policy - ref).detach() / tokens).mean(),  # per-token k1, as verl's kl metric
    }
    if mode == "tb":
        per_seq, log_z = tb.vargrad_tb_loss(policy, ref, reward, groups, beta, n_groups=n_rows)
        loss = aggregate(tb.spread_over_tokens(per_seq, mask), mask, "seq-mean-token-sum", config)
        # |A| = |log Z + delta| in 1/beta units, as the tb estimator reports it
        stats.update(
            {
                "tb/residual_var": per_seq.detach().mean(),
                "tb/log_z": log_z.mean(),
                "tb/mean_abs_advantage": per_seq.detach().sqrt().mean(),
            }
        )
    else:
        advantage, log_z = tb.tb_pg_advantage(policy, ref, reward, groups, beta, n_groups=n_rows)
        is_ratio_max = float(getattr(config.policy_loss, "is_ratio_max", IS_RATIO_MAX))
        ratio = torch.exp(log_prob - padded["rollout_log_probs"].to(log_prob.dtype)).detach()
        loss_mat = tb.tb_pg_loss_matrix(log_prob, advantage.unsqueeze(-1) * mask, ratio, is_ratio_max)
        loss = aggregate(loss_mat, mask, config.loss_agg_mode, config)
        stats.update(
            {
                "tb/log_z": log_z.mean(),
                "tb/mean_abs_advantage": advantage.abs().mean(),  # in reward units
                **{f"tb_pg/{k}": v for k, v in tb.ratio_stats(ratio, mask, is_ratio_max).items()},
            }
        )
    return loss, stats


def fused_tb_loss(config, model_output, data, dp_group=None):
    """verl engine loss (``set_loss_fn``) for ``loss_mode`` tb and tb_pg, computed from this forward alone
    (``fused_terms``). Returns (loss, metrics) as verl's ppo_loss does; the metrics come to the host in one read
    per micro-batch."""
    beta = float(tu.get_non_tensor_data(data=data, key=BETA_KEY, default=None))
    mode = tu.get_non_tensor_data(data=data, key=MODE_KEY, default=None)
    group_size = tu.get_non_tensor_data(data=data, key=GROUP_SIZE_KEY, default=None)
    if mode not in ("tb", "tb_pg") or group_size is None:
        raise RuntimeError(
            f"tba-ext fused update: the batch carries {MODE_KEY}={mode!r} and {GROUP_SIZE_KEY}={group_size!r}, "
            "expected tb or tb_pg and rollout.n (the tba_* trainer modes set them)"
        )
    _refuse_unhonoured(config, mode)
    _global_batch_info(config, data)
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    fields = ["response_mask", "rm_scores", "ref_log_prob", GROUP_FIELD] + (
        ["rollout_log_probs"] if mode == "tb_pg" else []
    )
    padded = data.select(*fields).to_padded_tensor()
    loss, stats = fused_terms(config, log_prob, padded, beta, mode, int(group_size))
    stats["actor/pg_loss"] = loss
    names = list(stats)
    values = dict(zip(names, torch.stack([stats[k].detach().to(torch.float32) for k in names]).tolist()))
    pg_loss = values.pop("actor/pg_loss")
    if values.pop(BAD_GROUPS_METRIC):
        labels = data.select(GROUP_FIELD).to_padded_tensor()[GROUP_FIELD].tolist()
        sizes = sorted({labels.count(label) for label in labels})
        raise RuntimeError(
            f"tba-ext fused update: a micro-batch holds prompt groups of sizes {sizes}; each must hold a whole "
            f"group of actor_rollout_ref.rollout.n={group_size} "
            "responses (a group was split across micro-batches, or the searchers returned another number)"
        )
    out = Metric.from_dict(values, aggregation=AggregationType.MEAN)
    # as verl's ppo_loss: a loss normalised over the global batch sums over micro-batches and ranks
    global_norm = (
        data["dp_size"] > 1
        or data["batch_num_tokens"] is not None
        or data["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    )
    aggregation = AggregationType.SUM if global_norm else AggregationType.MEAN
    out["actor/pg_loss"] = Metric(value=pg_loss, aggregation=aggregation)
    return loss, out


def install_fused_loss(worker) -> int:
    """Runs inside an actor worker (``__ray_call__``): replace verl's ppo_loss by ``fused_tb_loss`` with the
    same actor config. Returns how many actors were switched (1 per process)."""
    switched = 0
    for candidate in (worker, *getattr(worker, "worker_dict", {}).values()):
        actor, loss_fn = getattr(candidate, "actor", None), getattr(candidate, "loss_fn", None)
        if actor is None or not isinstance(loss_fn, functools.partial) or "config" not in loss_fn.keywords:
            continue
        actor.set_loss_fn(functools.partial(fused_tb_loss, config=loss_fn.keywords["config"]))
        switched += 1
    if not switched:
        raise RuntimeError("tba-ext fused update: no verl actor with a ppo_loss in this worker")
    return switched
