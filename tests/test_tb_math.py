"""The TB equations: the registered verl loss/estimator against a direct implementation of eq. 5."""

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the tba_ext plugin through its entry point)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from tba_ext.core import tb


def direct_eq5(policy_tok, ref_tok, mask, reward, groups, beta, log_z=None):
    """Eq. 5 written out plainly: per group, log Z = -mean(delta) (detached), loss = mean (log Z + delta)^2."""
    seq = lambda x: (x * mask).sum(-1)  # noqa: E731
    delta = seq(policy_tok) - seq(ref_tok) - reward / beta
    losses = []
    for g in groups.unique():
        d = delta[groups == g]
        lz = -d.mean().detach() if log_z is None else log_z[int(g)]
        losses.append((lz + d) ** 2)
    return torch.cat(losses).mean()


def make_batch(n_groups, k, length, seed):
    g = torch.Generator().manual_seed(seed)
    b = n_groups * k
    ref = -torch.rand(b, length, generator=g) * 2
    old = ref + 0.3 * torch.randn(b, length, generator=g)
    mask = torch.zeros(b, length)
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    reward = torch.randint(0, 2, (b,), generator=g).float() + 0.1 * torch.randn(b, generator=g)
    perm = torch.randperm(b, generator=g)  # groups interleaved, as verl's balanced batches are
    uids = np.array([f"p{i // k}" for i in range(b)], dtype=object)[perm.numpy()]
    return old, ref, mask, reward, uids


def algo_config(beta):
    return OmegaConf.create({"kl_ctrl": {"kl_coef": beta, "type": "fixed"}, "adv_estimator": "tb"})


class LossConfig:
    """The attributes verl's ppo_loss hands a policy loss (an ActorConfig), for one micro-batch."""

    def __init__(self, global_batch_size, dp_size=1, loss_scale=1.0):
        self.global_batch_info = {
            "dp_size": dp_size,
            "global_batch_size": global_batch_size,
            "batch_num_tokens": None,
            "loss_scale_factor": None,
        }
        self.policy_loss = OmegaConf.create({"loss_scale": loss_scale, "is_ratio_max": 8.0})


def tb_advantages(old, ref, mask, reward, uids, beta):
    """Run verl's KL-in-reward construction and the registered tb estimator."""
    token_rewards = -beta * (old - ref) * mask  # apply_kl_penalty with kl_penalty=kl
    last = mask.sum(-1).long() - 1
    token_rewards[torch.arange(len(reward)), last] += reward  # score on the last response token
    adv, _ = get_adv_estimator_fn("tb")(
        token_level_rewards=token_rewards, response_mask=mask, index=uids, config=algo_config(beta)
    )
    return adv


@pytest.mark.parametrize("n_groups,k,length,beta", [(3, 5, 7, 0.05), (2, 2, 3, 0.004), (4, 8, 12, 1.0)])
def test_tb_loss_equals_eq5_at_old_policy(n_groups, k, length, beta):
    old, ref, mask, reward, uids = make_batch(n_groups, k, length, seed=n_groups * 100 + k)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    theta = old.clone().requires_grad_(True)
    ours, _ = get_policy_loss_fn("tb")(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=LossConfig(len(reward)),
    )
    (g_ours,) = torch.autograd.grad(ours, theta)
    theta2 = old.clone().requires_grad_(True)
    groups = tb.group_ids(uids)
    ref_loss = direct_eq5(theta2, ref, mask, reward, groups, beta)
    (g_ref,) = torch.autograd.grad(ref_loss, theta2)
    assert torch.allclose(ours, ref_loss, rtol=1e-5, atol=1e-6)
    assert torch.allclose(g_ours, g_ref, rtol=1e-5, atol=1e-6)


def test_tb_loss_after_parameter_change_is_eq5_with_step_start_log_z():
    beta = 0.05
    old, ref, mask, reward, uids = make_batch(3, 5, 6, seed=7)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    g = torch.Generator().manual_seed(1)
    theta = (old + 0.5 * torch.randn(old.shape, generator=g)).requires_grad_(True)  # a later mini-batch
    ours, _ = get_policy_loss_fn("tb")(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=LossConfig(len(reward)),
    )
    (g_ours,) = torch.autograd.grad(ours, theta)
    groups = tb.group_ids(uids)
    seq = lambda x: (x * mask).sum(-1)  # noqa: E731
    delta_old = seq(old) - seq(ref) - reward / beta
    log_z_old = {int(g): -delta_old[groups == g].mean() for g in groups.unique()}
    theta2 = theta.detach().clone().requires_grad_(True)
    ref_loss = direct_eq5(theta2, ref, mask, reward, groups, beta, log_z=log_z_old)
    (g_ref,) = torch.autograd.grad(ref_loss, theta2)
    assert torch.allclose(ours, ref_loss, rtol=1e-5)
    assert torch.allclose(g_ours, g_ref, rtol=1e-5, atol=1e-6)
    # and it differs from re-estimating log Z at theta (the statement is precise, not vacuous)
    theta3 = theta.detach().clone().requires_grad_(True)
    (g_reestimated,) = torch.autograd.grad(direct_eq5(theta3, ref, mask, reward, groups, beta), theta3)
    assert (g_reestimated - g_ours).norm() > 1e-3 * g_ours.norm()


@pytest.mark.parametrize("dp_size", [1, 2])
def test_gradient_invariant_to_micro_batching_and_dp(dp_size):
    beta = 0.1
    old, ref, mask, reward, uids = make_batch(4, 4, 5, seed=3)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    loss_fn = get_policy_loss_fn("tb")
    theta = (old + 0.05).requires_grad_(True)
    full, _ = loss_fn(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=LossConfig(len(reward)),
    )
    (g_full,) = torch.autograd.grad(full, theta)
    # split the batch into dp ranks x micro-batches that cut through groups; DDP averages rank gradients
    theta2 = (old + 0.05).requires_grad_(True)
    ranks = torch.arange(len(reward)).chunk(dp_size)
    total = 0
    for rank_idx in ranks:
        for mb in rank_idx.chunk(3):
            loss, _ = loss_fn(
                old_log_prob=old[mb],
                log_prob=theta2[mb],
                advantages=adv[mb],
                response_mask=mask[mb].bool(),
                loss_agg_mode="token-mean",
                config=LossConfig(len(reward), dp_size=dp_size),
            )
            total = total + loss / dp_size
    (g_split,) = torch.autograd.grad(total, theta2)
    assert torch.allclose(g_full, g_split, rtol=1e-5, atol=1e-7)


def test_on_policy_gradient_is_mean_baseline_reinforce_on_kl_regularised_reward():
    """Paper App. A: at theta = old, grad L = -(2 / (N beta)) sum_ij A_ij grad l_theta(y_ij),
    A_ij = (r - r_bar) - beta (KL - KL_bar): REINFORCE with a group-mean baseline."""
    beta = 0.2
    old, ref, mask, reward, uids = make_batch(3, 4, 6, seed=11)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    theta = old.clone().requires_grad_(True)
    loss, _ = get_policy_loss_fn("tb")(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=LossConfig(len(reward)),
    )
    (g_tb,) = torch.autograd.grad(loss, theta)
    groups = tb.group_ids(uids)
    kl = ((old - ref) * mask).sum(-1)
    regularised = reward - beta * kl
    a = regularised - torch.stack([regularised[groups == g].mean() for g in groups])
    theta2 = old.clone().requires_grad_(True)
    surrogate = -(2.0 / (len(reward) * beta)) * (a.detach() * (theta2 * mask).sum(-1)).sum()
    (g_reinforce,) = torch.autograd.grad(surrogate, theta2)
    assert torch.allclose(g_tb, g_reinforce, rtol=1e-5, atol=1e-6)


def test_tb_pg_advantage_is_beta_times_tb_advantage_and_weight_is_the_clamped_ratio_to_the_rollout_policy():
    beta = 0.05
    old, ref, mask, reward, uids = make_batch(2, 4, 5, seed=5)
    adv_tb = tb_advantages(old, ref, mask, reward, uids, beta)
    token_rewards = -beta * (old - ref) * mask
    token_rewards[torch.arange(len(reward)), mask.sum(-1).long() - 1] += reward
    adv_pg, _ = get_adv_estimator_fn("tb_pg")(
        token_level_rewards=token_rewards, response_mask=mask, index=uids, config=algo_config(beta)
    )
    assert torch.allclose(adv_pg, beta * adv_tb, atol=1e-6)
    # the searcher generated these tokens with older weights: rollout log-probs differ from the trainer's
    g = torch.Generator().manual_seed(6)
    rollout = old - 3.0 * torch.rand(old.shape, generator=g) * mask + 1.0 * torch.rand(old.shape, generator=g) * mask
    correction = {"rollout_is": "token", "rollout_is_threshold": 1e6}  # algo/tb_pg.yaml
    is_weights_proto, _, _ = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, **correction
    )
    is_weights = is_weights_proto.batch["rollout_is_weights"]  # as verl stores it for the actor
    theta = (old + 0.2 * torch.randn(old.shape, generator=g) * mask).requires_grad_(True)
    loss, metrics = get_policy_loss_fn("tb_pg")(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv_pg,
        response_mask=mask.bool(),
        loss_agg_mode="seq-mean-token-sum",
        config=LossConfig(len(reward)),
        rollout_is_weights=is_weights,
    )
    (grad,) = torch.autograd.grad(loss, theta)
    weight = torch.clamp(torch.exp(theta.detach() - rollout), max=8.0)  # min(pi_theta / pi_rollout, 8)
    expected = -weight * adv_pg * mask / len(reward)  # d/dtheta of seq-mean-token-sum of -w A log pi
    assert torch.allclose(grad, expected, atol=1e-5)
    real = mask.bool()
    assert (weight[real] - 1).abs().max() > 0.5  # stale tokens: the weight is not 1
    assert (weight[real] == 8.0).any() and (weight[real] < 8.0).any()  # some clamped at 8, some not
    assert 0 < metrics["tb_pg/is_ratio_clipfrac"] < 1
    with pytest.raises(ValueError, match="rollout_correction.rollout_is=token"):
        get_policy_loss_fn("tb_pg")(
            old_log_prob=old,
            log_prob=theta,
            advantages=adv_pg,
            response_mask=mask.bool(),
            loss_agg_mode="seq-mean-token-sum",
            config=LossConfig(len(reward)),
        )


def test_padding_rows_get_zero_advantage_and_stay_out_of_the_groups():
    """verl pads a batch to a multiple of the data-parallel size with rows of empty response mask sharing one
    uid; one such row is a 'group of size 1' that must not stop TB."""
    beta = 0.1
    old, ref, mask, reward, uids = make_batch(2, 3, 4, seed=2)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    pad_mask = torch.cat([mask, torch.zeros(1, mask.shape[1])])
    padded = [torch.cat([x, torch.zeros(1, x.shape[1])]) for x in (old, ref)]
    adv_padded = tb_advantages(*padded, pad_mask, torch.cat([reward, torch.zeros(1)]), np.append(uids, "pad0"), beta)
    assert torch.equal(adv_padded[:-1], adv) and not adv_padded[-1].any()


def test_beta_schedule_matches_reference_code():
    b0, bf, n = 0.014, 0.004, 500
    assert tb.beta_at_step(1, b0, bf, n) == pytest.approx(b0)
    assert tb.beta_at_step(251, b0, bf, n) == pytest.approx(bf * 0.5 + b0 * 0.5)
    assert tb.beta_at_step(500, b0, bf, n) == pytest.approx(bf)
    assert tb.beta_at_step(900, b0, bf, n) == pytest.approx(bf)
    assert tb.beta_at_step(42, b0, None, 0) == pytest.approx(b0)


def test_update_counting_of_steps_and_reference_resets():
    # k = 2 updates per global step: step 1 opens with update 1, step 3 with update 5
    assert [tb.first_update(g, 2) for g in (1, 2, 3)] == [1, 3, 5]
    assert [tb.first_update(g, 1) for g in (1, 2, 3)] == [1, 2, 3]
    # rho = 4 updates, steps of 2 updates: a reset after steps 2, 4, 6 (updates 4, 8, 12), none after odd steps
    assert [tb.multiples_passed((g - 1) * 2, g * 2, 4) for g in range(1, 7)] == [0, 1, 0, 1, 0, 1]
    # rho = 1 with steps of 3 updates: three EMA updates are due after each step
    assert tb.multiples_passed(3, 6, 1) == 3
    assert tb.multiples_passed(0, 10, 0) == 0


def test_reference_update_copies_or_averages_the_policy_shard_by_shard():
    from types import SimpleNamespace

    from tba_ext.adapters.reference import _actor_shards, _update_reference

    def worker(module):
        return SimpleNamespace(engine=SimpleNamespace(module=module))

    torch.manual_seed(0)
    actor, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    ref_before = {k: v.clone() for k, v in ref.state_dict().items()}
    hybrid = SimpleNamespace(actor=worker(actor), ref=worker(ref))
    # EMA with keep 0.9: ref <- 0.9 ref + 0.1 policy, in place in the reference's own tensors
    assert _update_reference(hybrid, None, 0.9) == 2
    for name, value in ref.state_dict().items():
        assert torch.allclose(value, 0.9 * ref_before[name] + 0.1 * actor.state_dict()[name])
    # a separate reference worker group: the actor's shards travel as CPU tensors, keep 0 copies them
    separate = SimpleNamespace(ref=worker(ref))
    _update_reference(separate, _actor_shards(SimpleNamespace(actor=worker(actor))), 0.0)
    assert all(torch.equal(ref.state_dict()[k], v) for k, v in actor.state_dict().items())
    with pytest.raises(RuntimeError, match="sharded like the actor"):
        _update_reference(separate, {"weight": torch.zeros(2, 4), "bias": torch.zeros(3)}, 0.0)


def test_loss_scale_and_gradient_clipping():
    """TB gradients are O(r / beta): at beta = 0.004 the norm is far above verl's grad_clip = 1.0, so the clip
    always binds and the clipped gradient is the same unit vector whatever loss_scale is; loss_scale only
    matters once it brings the norm under the clip (here beta^2 does)."""
    beta = 0.004
    old, ref, mask, reward, uids = make_batch(2, 5, 6, seed=9)
    reward = (reward > 0.5).float()
    adv = tb_advantages(old, ref, mask, reward, uids, beta)
    clipped = {}
    norms = {}
    for scale in (1.0, 0.01, beta**2):
        theta = old.clone().requires_grad_(True)
        loss, _ = get_policy_loss_fn("tb")(
            old_log_prob=old,
            log_prob=theta,
            advantages=adv,
            response_mask=mask.bool(),
            loss_agg_mode="token-mean",
            config=LossConfig(len(reward), loss_scale=scale),
        )
        (g,) = torch.autograd.grad(loss, theta)
        norms[scale] = g.norm().item()
        clipped[scale] = g * min(1.0, 1.0 / (norms[scale] + 1e-6))  # torch clip_grad_norm_(max_norm=1.0)
    assert norms[1.0] > 100  # r / beta = 250 residuals
    assert norms[0.01] == pytest.approx(0.01 * norms[1.0], rel=1e-5)
    assert torch.allclose(clipped[1.0], clipped[0.01], atol=1e-6)  # clip binds: same update direction/size
    assert norms[beta**2] < 1.0  # under the clip: the update now scales with the loss
    assert not torch.allclose(clipped[beta**2], clipped[1.0], atol=1e-3)


def test_groups_of_one_are_refused():
    old, ref, mask, reward, uids = make_batch(2, 2, 3, seed=1)
    uids = np.array([f"u{i}" for i in range(len(uids))], dtype=object)
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        tb_advantages(old, ref, mask, reward, uids, 0.1)


def test_zero_variance_fraction():
    assert tb.zero_variance_fraction(np.array([1, 1, 0, 1]), ["a", "a", "b", "b"]) == 0.5
