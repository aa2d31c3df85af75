"""The core TB equations on their own (no verl), each against an independent formula written out here."""

import subprocess
import sys

import pytest
import torch

from tba_ext.core import tb


def test_core_modules_import_no_verl():
    code = (
        "import sys, tba_ext.core.tb, tba_ext.core.replay, tba_ext.core.settings, tba_ext.core.steps, "
        "tba_ext.core.wire, tba_ext.core.ledger; "
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def batch(n_groups=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = n_groups * k
    reward = torch.randint(0, 2, (b,), generator=g).float()
    kl = 0.5 * torch.randn(b, generator=g)
    groups = torch.randperm(b, generator=g) % n_groups  # interleaved, as verl's balanced batches are
    return reward, kl, groups


@pytest.mark.parametrize("beta", [0.05, 1.0])
def test_tb_advantage_is_the_group_centred_kl_regularised_reward_over_beta(beta):
    reward, kl, groups = batch()
    advantage, stats = tb.tb_advantage(reward - beta * kl, groups, beta)
    pg_advantage, _ = tb.tb_advantage(reward - beta * kl, groups, beta, pg_units=True)
    for i in range(len(reward)):
        same = groups == groups[i]
        expected = (reward[i] - reward[same].mean()) / beta - (kl[i] - kl[same].mean())  # App. A
        assert advantage[i].item() == pytest.approx(expected.item(), abs=1e-5)
        assert pg_advantage[i].item() == pytest.approx(beta * expected.item(), abs=1e-6)
    # log Z_i = -mean_j delta_ij at the step-start policy, delta = kl - r / beta (eq. 5)
    log_z = torch.stack(
        [-(kl[groups == groups[i]] - reward[groups == groups[i]] / beta).mean() for i in range(len(reward))]
    )
    assert stats["log_z"] == pytest.approx(log_z.mean().item(), rel=1e-5)
    assert stats["mean_abs_advantage"] == pytest.approx(advantage.abs().mean().item())


def test_a_group_of_one_is_refused():
    with pytest.raises(ValueError, match="at least 2 responses"):
        tb.tb_advantage(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), 0.1)


def test_advantage_form_loss_has_the_gradient_of_eq5_at_the_step_start_policy():
    """(l_theta - l_old - A)^2 at theta = old: value and gradient equal the direct VarGrad loss of eq. 5."""
    beta = 0.1
    reward, _, groups = batch(seed=1)
    ref = -3 + torch.randn(len(reward), generator=torch.Generator().manual_seed(2))
    old = ref + 0.2 * torch.randn(len(reward), generator=torch.Generator().manual_seed(3))
    theta_direct = old.clone().requires_grad_(True)
    delta = theta_direct - ref - reward / beta
    log_z = torch.stack([-delta[groups == g].mean() for g in groups]).detach()
    direct = ((log_z + delta) ** 2).mean()
    direct.backward()
    advantage, _ = tb.tb_advantage(reward - beta * (old - ref), groups, beta)
    theta = old.clone().requires_grad_(True)
    loss = tb.tb_loss_from_advantage(theta, old, advantage).mean()
    loss.backward()
    assert loss.item() == pytest.approx(direct.item(), rel=1e-5)
    assert torch.allclose(theta.grad, theta_direct.grad, atol=1e-5)


def test_tba_prime_ratio_is_taken_against_the_searchers_policy_and_clamped():
    g = torch.Generator().manual_seed(4)
    rollout = -torch.rand(2, 5, generator=g) * 3
    old = rollout + 0.5 * torch.randn(2, 5, generator=g)  # the trainer moved since the searcher generated
    theta = (old + 0.3 * torch.randn(2, 5, generator=g)).requires_grad_(True)
    ratio = tb.rollout_ratio(theta, old, torch.exp(old - rollout))
    assert torch.allclose(ratio, torch.exp(theta - rollout).detach(), atol=1e-5)
    assert not ratio.requires_grad
    advantage = torch.tensor([[1.5], [-0.5]])
    tb.tb_pg_loss_matrix(theta, advantage, ratio, is_ratio_max=1.2).sum().backward()
    assert torch.allclose(theta.grad, -torch.clamp(ratio, max=1.2) * advantage, atol=1e-6)


def test_beta_anneal_follows_the_reference_formula_in_updates():
    # reference: beta_u = beta_f (u - 1) / N + beta_i (1 - (u - 1) / N) for u < N, then beta_f
    assert tb.beta_at_step(1, 0.014, 0.004, 500) == pytest.approx(0.014)
    assert tb.beta_at_step(251, 0.014, 0.004, 500) == pytest.approx(0.004 * 0.5 + 0.014 * 0.5)
    assert tb.beta_at_step(500, 0.014, 0.004, 500) == pytest.approx(0.004)
    assert tb.beta_at_step(9, 0.05, None, 0) == 0.05
    assert [tb.first_update(g, 3) for g in (1, 2, 3)] == [1, 4, 7]
    assert tb.multiples_passed(3, 9, 4) == 2 and tb.multiples_passed(4, 7, 4) == 0


def test_ratio_stats_count_only_response_tokens():
    ratio = torch.tensor([[0.5, 9.0, 100.0], [2.0, 8.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 100.0 is padding
    stats = tb.ratio_stats(ratio, mask, is_ratio_max=8.0)
    kept = [0.5, 9.0, 2.0, 8.0, 3.0]
    assert stats["is_ratio_clipfrac"].item() == pytest.approx(sum(r > 8.0 for r in kept) / len(kept))
    assert stats["ratio_mean"].item() == pytest.approx(sum(kept) / len(kept))
    assert stats["ratio_max"].item() == 9.0


def test_tba_prime_without_kl_is_the_group_centred_reward_and_plain_tb_refuses_beta_zero():
    from tba_ext.core.settings import checked_beta

    torch.manual_seed(0)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    policy, ref = torch.randn(6), torch.randn(6)
    advantage, log_z = tb.tb_pg_advantage(policy, ref, reward, groups, beta=0.0)
    centred = reward - torch.tensor([1 / 3] * 3 + [2 / 3] * 3)  # r - r_bar: no KL term at all
    assert torch.allclose(advantage, centred)
    assert torch.isnan(log_z).all()  # log Z = mean S / beta does not exist without KL
    assert checked_beta(0.0, allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="kl_coef.*0 only with tb_pg"):
        checked_beta(0.0)
