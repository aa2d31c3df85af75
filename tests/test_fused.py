"""The fused TB / TBA' loss (tba_ext.adapters.fused) on micro-batches in verl's engine format.

Against an independent eq. 5 at any policy (updates 2..k of a step included), and against the three-call path
(verl's old-log-prob pass, the registered estimator, the registered loss) at theta = old.
"""

import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the tba_ext plugin through its entry point)
from omegaconf import OmegaConf
from tensordict import TensorDict
from test_tb_math import LossConfig, direct_eq5, tb_advantages
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.utils import tensordict_utils as tu

from tba_ext.adapters import fused
from tba_ext.adapters.checks import fused_update_plan
from tba_ext.core import tb, wire
from tba_ext.core.settings import TBASettings


class ActorConfig(LossConfig):
    """The ActorConfig attributes the fused loss reads (verl hands it the worker's actor config)."""

    def __init__(self, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8, entropy_coeff=0.0):
        super().__init__(global_batch_size=None)
        self.loss_agg_mode = loss_agg_mode
        self.loss_scale_factor = self.global_batch_info["loss_scale_factor"] = loss_scale_factor
        self.entropy_coeff = entropy_coeff


def group_batch(n_groups, k, length, seed, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    b = n_groups * k
    ref = -torch.rand(b, length, generator=g) * 2
    old = ref + 0.3 * torch.randn(b, length, generator=g)
    rollout = old + 0.2 * torch.randn(b, length, generator=g)  # the searcher's policy, a few updates stale
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    reward = torch.randint(0, 2, (b,), generator=g).float() + 0.1 * torch.randn(b, generator=g)
    groups = torch.arange(b) // k
    if shuffle:  # members of a group need not be adjacent within a micro-batch
        perm = torch.randperm(b, generator=g)
        old, ref, rollout, mask, reward, groups = (x[perm] for x in (old, ref, rollout, mask, reward, groups))
    return old, ref, rollout, mask, reward, groups


def engine_inputs(theta, ref, rollout, mask, reward, groups, beta, mode, rows, global_batch_size, dp_size=1):
    """``rows`` of the batch as verl's engine hands one micro-batch to its loss: nested (jagged) response
    fields, the model's log-probs over prompt + response unpadded (shifted by one), batch info non-tensor."""
    resp_len = mask[rows].sum(-1).long().tolist()
    prompt_len = [2 + (i % 3) for i in range(len(rows))]
    flat = []
    for row, p, r in zip(rows, prompt_len, resp_len):
        # position t of the unpadded output predicts token t + 1: response token s sits at p - 1 + s
        flat += [torch.zeros(p - 1), theta[row, :r], torch.zeros(1)]
    log_probs = torch.cat(flat)

    def nested(per_row):
        return torch.nested.nested_tensor(per_row, layout=torch.jagged)

    scores = []
    for row, r in zip(rows, resp_len):
        s = torch.zeros(r)
        s[-1] = reward[row]
        scores.append(s)
    data = TensorDict(
        {
            "prompts": nested([torch.ones(p, dtype=torch.long) for p in prompt_len]),
            "responses": nested([torch.ones(r, dtype=torch.long) for r in resp_len]),
            "response_mask": nested([torch.ones(r, dtype=torch.long) for r in resp_len]),
            "rm_scores": nested(scores),
            "ref_log_prob": nested([ref[row, :r] for row, r in zip(rows, resp_len)]),
            "rollout_log_probs": nested([rollout[row, :r] for row, r in zip(rows, resp_len)]),
            wire.GROUP_FIELD: groups[rows],
        },
        batch_size=[len(rows)],
    )
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=int(mask.sum()),
        global_batch_size=global_batch_size,
        **{wire.BETA_KEY: beta, wire.MODE_KEY: mode, wire.GROUP_SIZE_KEY: int(torch.bincount(groups).max())},
    )
    return {"log_probs": log_probs}, data


def fused_loss(theta, batch, beta, mode, micro_batches, config=None, dp_size=1):
    """Sum of the fused loss over ``micro_batches`` (lists of rows), as verl's gradient accumulation sums."""
    _, ref, rollout, mask, reward, groups = batch
    total, metrics = 0.0, []
    for rows in micro_batches:
        out, data = engine_inputs(
            theta, ref, rollout, mask, reward, groups, beta, mode, rows, global_batch_size=len(reward), dp_size=dp_size
        )
        loss, m = fused.fused_tb_loss(config or ActorConfig(), out, data)
        total, metrics = total + loss, metrics + [m]
    return total, metrics


def rows_of(groups, group_ids):
    return [i for i in range(len(groups)) if int(groups[i]) in group_ids]


@pytest.mark.parametrize("n_groups,k,beta", [(4, 5, 0.05), (2, 2, 0.004), (6, 3, 1.0)])
def test_fused_tb_is_eq5_at_any_policy_for_any_split_into_whole_groups(n_groups, k, beta):
    batch = group_batch(n_groups, k, 7, seed=n_groups)
    old, ref, _, mask, reward, groups = batch
    for drift in (0.0, 0.5):  # theta = old (update 1) and theta moved (updates 2..k share one sample)
        theta = (old + drift * torch.randn(old.shape, generator=torch.Generator().manual_seed(7))).requires_grad_()
        expected = direct_eq5(theta, ref, mask, reward, groups, beta)
        (g_expected,) = torch.autograd.grad(expected, theta)
        for split in (
            [list(range(n_groups))],
            [[g] for g in range(n_groups)],
            [list(range(0, n_groups, 2)), list(range(1, n_groups, 2))],
        ):
            loss, _ = fused_loss(theta, batch, beta, "tb", [rows_of(groups, s) for s in split])
            (g_loss,) = torch.autograd.grad(loss, theta)
            assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-6), (drift, split)
            assert torch.allclose(g_loss, g_expected, rtol=1e-5, atol=1e-6), (drift, split)


@pytest.mark.parametrize("mode", ["tb", "tb_pg"])
def test_a_float64_forward_keeps_the_fused_loss_in_float64(mode):
    """The fused loss promotes low-precision log-probs to float32 and never casts float64 down: in float64 it is
    eq. 5 (and TBA′'s loss is the same at every split) to float64 rounding, far below float32's 1e-7."""
    old, ref, rollout, mask, reward, groups = group_batch(3, 4, 6, seed=3)
    batch = (*(x.double() for x in (old, ref, rollout, mask, reward)), groups)
    theta = (batch[0] + 0.3).requires_grad_()
    loss, _ = fused_loss(theta, batch, 0.05, mode, [list(range(12))])
    assert loss.dtype == torch.float64
    if mode == "tb":
        expected = direct_eq5(theta, batch[1], batch[3], batch[4], groups, 0.05)
    else:
        expected, _ = fused_loss(theta, batch, 0.05, mode, [rows_of(groups, [g]) for g in range(3)])
    assert abs(float(loss) - float(expected)) <= 1e-12 * max(1.0, abs(float(expected)))


def test_fused_tb_equals_the_three_call_update_at_theta_old_and_drops_its_drift_term_after():
    beta = 0.05
    batch = group_batch(3, 4, 6, seed=11)
    old, ref, _, mask, reward, groups = batch
    uids = np.array([f"p{int(g)}" for g in groups], dtype=object)
    adv = tb_advantages(old, ref, mask, reward, uids, beta)  # verl's KL-in-reward + the registered estimator
    three_call = get_policy_loss_fn("tb")
    every_group = [list(range(len(groups)))]
    for drift in (0.0, 0.4):
        theta = (old + drift * torch.randn(old.shape, generator=torch.Generator().manual_seed(3))).requires_grad_()
        ours, _ = fused_loss(theta, batch, beta, "tb", every_group)
        theirs, _ = three_call(
            old_log_prob=old,
            log_prob=theta,
            advantages=adv,
            response_mask=mask.bool(),
            config=LossConfig(global_batch_size=len(reward)),
        )
        (g_ours,) = torch.autograd.grad(ours, theta)
        (g_theirs,) = torch.autograd.grad(theirs, theta)
        if drift == 0.0:
            assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6)
            assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-6)
        else:  # log Z held at its step-start value adds mean_i (mean_j [l_theta - l_old])^2 to eq. 5
            moved = tb.sequence_logprob(theta - old, mask).detach()
            drift_term = (tb.group_mean(moved, groups) ** 2).mean()
            assert drift_term > 1e-2
            assert torch.allclose(theirs - ours, drift_term, rtol=1e-4, atol=1e-6)
            assert not torch.allclose(g_ours, g_theirs, rtol=1e-3, atol=1e-4)


def test_fused_tb_pg_equals_the_three_call_update_at_theta_old_with_the_ratio_to_the_searcher():
    beta = 0.05
    batch = group_batch(3, 4, 6, seed=5)
    old, ref, rollout, mask, reward, groups = batch
    uids = np.array([f"p{int(g)}" for g in groups], dtype=object)
    token_rewards = -beta * (old - ref) * mask
    token_rewards[torch.arange(len(reward)), mask.sum(-1).long() - 1] += reward
    adv, _ = get_adv_estimator_fn("tb_pg")(
        token_level_rewards=token_rewards,
        response_mask=mask,
        index=uids,
        config=OmegaConf.create({"kl_ctrl": {"kl_coef": beta, "type": "fixed"}}),
    )
    theta = old.clone().requires_grad_()
    config = ActorConfig()
    config.global_batch_info.update(global_batch_size=len(reward), batch_num_tokens=int(mask.sum()))
    theirs, their_metrics = get_policy_loss_fn("tb_pg")(
        old_log_prob=old,
        log_prob=theta,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=torch.exp(old - rollout) * mask,
    )  # verl's token IS weight pi_old/pi_rollout
    ours, our_metrics = fused_loss(theta, batch, beta, "tb_pg", [list(range(len(groups)))])
    (g_ours,) = torch.autograd.grad(ours, theta)
    (g_theirs,) = torch.autograd.grad(theirs, theta)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-6)
    clipfrac = our_metrics[0]["tb_pg/is_ratio_clipfrac"].values[0]
    assert clipfrac == pytest.approx(float(their_metrics["tb_pg/is_ratio_clipfrac"]))


def test_a_group_split_across_micro_batches_is_refused():
    batch = group_batch(2, 4, 5, seed=1, shuffle=False)
    theta = batch[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="split across micro-batches"):
        fused_loss(theta, batch, 0.1, "tb", [[0, 1, 2, 3, 4, 5], [6, 7]])


def test_tb_pg_is_the_same_update_for_any_split_into_micro_batches_of_uneven_lengths():
    """One micro-batch or one per group (each padded to its own longest response): the same loss and gradient with
    a constant loss_scale_factor; verl's default (each micro-batch over its own padded length) is refused."""
    beta = 0.05
    batch = group_batch(4, 3, 9, seed=8)
    old, _, _, mask, _, groups = batch
    assert len(set(mask.sum(-1).tolist())) > 3  # uneven lengths: the micro-batches pad differently
    splits = ([list(range(4))], [[g] for g in range(4)], [[0, 3], [1, 2]])
    results = []
    for split in splits:
        theta = old.clone().requires_grad_()
        loss, _ = fused_loss(theta, batch, beta, "tb_pg", [rows_of(groups, s) for s in split])
        results.append((loss.detach(), torch.autograd.grad(loss, theta)[0]))
    for loss, grad in results[1:]:
        assert torch.allclose(loss, results[0][0], rtol=1e-6, atol=1e-7)
        assert torch.allclose(grad, results[0][1], rtol=1e-5, atol=1e-7)
    theta = old.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="loss_scale_factor unset"):
        fused_loss(theta, batch, beta, "tb_pg", [list(range(len(groups)))], config=ActorConfig(loss_scale_factor=None))


def test_what_the_fused_loss_cannot_honour_is_refused_at_run_time_naming_the_key():
    batch = group_batch(2, 4, 5, seed=1)
    theta = batch[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match=r"actor_rollout_ref\.actor\.entropy_coeff=0\.01"):
        fused_loss(theta, batch, 0.1, "tb", [list(range(8))], config=ActorConfig(entropy_coeff=0.01))
    # whole groups, but not of rollout.n (the searchers returned 4 where the run asked 5)
    out, data = engine_inputs(theta, *batch[1:], 0.1, "tb", list(range(8)), global_batch_size=8)
    tu.assign_non_tensor(data, **{wire.GROUP_SIZE_KEY: 5})
    with pytest.raises(RuntimeError, match=r"sizes \[4\].*rollout\.n=5"):
        fused.fused_tb_loss(ActorConfig(), out, data)


def plan_config(**actor):
    cfg = {
        "algorithm": {"adv_estimator": "tb"},
        "data": {"train_batch_size": 16, "max_prompt_length": 32, "max_response_length": 8},
        "actor_rollout_ref": {
            "rollout": {"n": 4},
            "actor": {"strategy": "fsdp2", "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 16, **actor},
        },
        "trainer": {"n_gpus_per_node": 2, "nnodes": 1, "v1": {"trainer_mode": "tba_sync"}},
    }
    return cfg


def test_fused_update_plan_refuses_what_cannot_keep_groups_whole_naming_the_key():
    assert fused_update_plan(plan_config(), TBASettings()) == (True, "fused")
    assert not fused_update_plan(plan_config(), TBASettings(fused_update=False))[0]
    fused_on, why = fused_update_plan(plan_config(strategy="megatron"), TBASettings())
    assert not fused_on and "Megatron" in why
    refusals = {
        "actor.shuffle": dict(shuffle=True),
        "ppo_micro_batch_size_per_gpu=6": dict(ppo_micro_batch_size_per_gpu=6),
        "ppo_max_token_len_per_gpu=100": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=100),
        "ppo_mini_batch_size=3": dict(ppo_mini_batch_size=3),
        "entropy_coeff=0.01": dict(entropy_coeff=0.01),
    }
    for key, actor in refusals.items():
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            fused_update_plan(plan_config(**actor), TBASettings())
    assert fused_update_plan(plan_config(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=160), TBASettings())[0]


def test_the_reference_forward_in_the_update_marks_every_missing_row_and_as_many_rows_on_every_rank():
    from tba_ext.adapters.reference import rows_to_mark

    rng = np.random.default_rng(0)
    for ranks, per_rank in [(1, 6), (2, 6), (4, 3), (3, 8)]:
        for _ in range(50):
            missing = (rng.random(ranks * per_rank) < rng.random()).tolist()
            marked = rows_to_mark(missing, ranks)
            assert len(set(marked)) == len(marked)
            assert {i for i, m in enumerate(missing) if m} <= set(marked)  # every row without log-probs
            counts = [sum(r * per_rank <= i < (r + 1) * per_rank for i in marked) for r in range(ranks)]
            most = max(sum(missing[r * per_rank : (r + 1) * per_rank]) for r in range(ranks))
            assert counts == [most] * ranks  # level with the rank missing most, and no more
    assert rows_to_mark([False] * 4, 2) == []
    with pytest.raises(RuntimeError, match="5 rows cannot be split over 2"):
        rows_to_mark([True] * 5, 2)


def test_fused_tb_pg_without_kl_ignores_the_reference_and_is_the_limit_of_small_beta():
    """TBA′ at beta = 0 (the stress study's arm): the advantage is r - r_bar, so the reference drops out, the loss and
    its gradient are those of beta -> 0, and log Z (mean S / beta) is reported as NaN, not as an infinity."""
    batch = group_batch(3, 4, 6, seed=11)
    old, ref, rollout, mask, reward, groups = batch
    theta = (old + 0.3).requires_grad_()
    split = [list(range(len(groups)))]
    zero, metrics = fused_loss(theta, batch, 0.0, "tb_pg", split)
    (g_zero,) = torch.autograd.grad(zero, theta)
    other_ref = (old, ref - 1.0, rollout, mask, reward, groups)
    again, _ = fused_loss(theta, other_ref, 0.0, "tb_pg", split)
    (g_again,) = torch.autograd.grad(again, theta)
    assert torch.isfinite(zero) and torch.equal(zero, again) and torch.equal(g_zero, g_again)
    tiny, _ = fused_loss(theta, batch, 1e-9, "tb_pg", split)
    (g_tiny,) = torch.autograd.grad(tiny, theta)
    assert torch.allclose(zero, tiny, atol=1e-6) and torch.allclose(g_zero, g_tiny, atol=1e-6)
    assert math.isnan(float(metrics[0]["tb/log_z"].values[0]))


@pytest.mark.parametrize("mode", ["tb", "tb_pg"])
def test_the_weight_sync_check_is_the_largest_on_policy_log_prob_gap_at_an_updates_first_micro_batch(mode):
    """tba/rollout_logprob_diff_max: max |log pi_theta - log pi_rollout| over the response tokens of the rows the
    trainer marks on-policy, at the first micro-batch of each update call only (later ones may follow an optimizer
    step and report 0 rows); a new call compares again."""
    batch = group_batch(3, 4, 6, seed=5)
    old, ref, rollout, mask, reward, groups = batch
    on_policy = torch.tensor([1, 1, 0, 1] * 3)  # rows 2, 6, 10: generated by older weights
    theta = old.clone().requires_grad_()
    expected = float(((theta.detach() - rollout).abs() * mask)[on_policy.bool()].max())
    off_policy_gap = float(((theta.detach() - rollout).abs() * mask)[~on_policy.bool()].max())
    assert off_policy_gap != expected  # the marked rows decide it

    def run(update, rows):
        out, data = engine_inputs(theta, ref, rollout, mask, reward, groups, 0.05, mode, rows, global_batch_size=12)
        data[wire.ON_POLICY_FIELD] = on_policy[rows]
        tu.assign_non_tensor(data, **{wire.UPDATE_KEY: update})
        _, metrics = fused.fused_tb_loss(ActorConfig(), out, data)
        return {k: metrics[k].aggregate() for k in (wire.ROLLOUT_LOGPROB_DIFF_METRIC, wire.ON_POLICY_ROWS_METRIC)}

    first = run("3.0", list(range(12)))
    assert first[wire.ROLLOUT_LOGPROB_DIFF_METRIC] == pytest.approx(expected, rel=1e-6)
    assert first[wire.ON_POLICY_ROWS_METRIC] == 9
    later = run("3.0", rows_of(groups, [0]))  # the same call's next micro-batch
    assert later == {wire.ROLLOUT_LOGPROB_DIFF_METRIC: 0.0, wire.ON_POLICY_ROWS_METRIC: 0.0}
    nxt = run("4.0", rows_of(groups, [0]))
    on_rows = [r for r in rows_of(groups, [0]) if on_policy[r]]
    assert nxt[wire.ON_POLICY_ROWS_METRIC] == len(on_rows)
    gap = float(((theta.detach() - rollout).abs() * mask)[on_rows].max())
    assert nxt[wire.ROLLOUT_LOGPROB_DIFF_METRIC] == pytest.approx(gap, rel=1e-6)
