"""The paper's central promise on an enumerable sequence space: trained only on samples from a FIXED
behaviour policy, TB converges to pi_ref * exp(r / beta); Dr. GRPO's loss on the same data does not.

The policy is tabular and autoregressive (one logit vector per prefix), so KL(target || policy) is exact.
Both runs use the loss and advantage functions registered in verl, exactly as verl's trainer calls them.
"""

import itertools

import numpy as np
import torch
import verl  # noqa: F401
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn, get_policy_loss_fn

VOCAB, LENGTH, BETA = 3, 3, 0.5
SEQUENCES = list(itertools.product(range(VOCAB), repeat=LENGTH))


class TabularPolicy(torch.nn.Module):
    def __init__(self, seed: int, scale: float = 0.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.prefixes = {
            p: i for i, p in enumerate(p for n in range(LENGTH) for p in itertools.product(range(VOCAB), repeat=n))
        }
        self.logits = torch.nn.Parameter(scale * torch.randn(len(self.prefixes), VOCAB, generator=g))

    def token_logprobs(self, seqs: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(self.logits, -1)
        rows = [[self.prefixes[tuple(s[:t].tolist())] for t in range(LENGTH)] for s in seqs]
        return logp[torch.tensor(rows), seqs]

    def seq_logprobs_all(self) -> torch.Tensor:
        return self.token_logprobs(torch.tensor(SEQUENCES)).sum(-1)


class LossConfig:
    def __init__(self, n):
        self.global_batch_info = {
            "dp_size": 1,
            "global_batch_size": n,
            "batch_num_tokens": None,
            "loss_scale_factor": None,
        }
        self.policy_loss = OmegaConf.create(
            {
                "loss_mode": "vanilla",
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "clip_ratio_c": 3.0,
                "loss_scale": 1.0,
            }
        )
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high, self.clip_ratio_c = 0.2, 0.2, 0.2, 3.0
        self.tau_pos, self.tau_neg = 1.0, 1.05

    def get(self, key, default=None):
        return getattr(self, key, default)


def train(method: str, steps: int = 600, groups: int = 4, k: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    reward_table = torch.rand(len(SEQUENCES), generator=g) * 2.0
    ref = TabularPolicy(seed=100, scale=1.0)
    policy = TabularPolicy(seed=100, scale=1.0)  # initialised at the reference, as in RL fine-tuning
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    behaviour = torch.full((len(SEQUENCES),), 1.0 / len(SEQUENCES))  # fixed, full support, never updated
    algo = OmegaConf.create({"kl_ctrl": {"kl_coef": BETA, "type": "fixed"}})
    mask = torch.ones(groups * k, LENGTH)
    uids = np.array([f"g{i // k}" for i in range(groups * k)], dtype=object)
    for step in range(steps):
        idx = torch.multinomial(behaviour, groups * k, replacement=True, generator=g)
        seqs = torch.tensor([SEQUENCES[i] for i in idx])
        reward = reward_table[idx]
        with torch.no_grad():
            old = policy.token_logprobs(seqs)  # verl recomputes old_log_prob at the step start
            ref_lp = ref.token_logprobs(seqs)
        scores = torch.zeros(groups * k, LENGTH)
        scores[:, -1] = reward
        if method == "tb":
            token_rewards = scores - BETA * (old - ref_lp)  # verl's apply_kl_penalty, kl_penalty=kl
            adv, _ = get_adv_estimator_fn("tb")(
                token_level_rewards=token_rewards, response_mask=mask, index=uids, config=algo
            )
            loss_fn, agg = get_policy_loss_fn("tb"), "seq-mean-token-sum"
        else:  # Dr. GRPO: grpo advantages without std normalisation, seq-mean-token-sum-norm, no KL
            adv, _ = compute_grpo_outcome_advantage(scores, mask, uids, norm_adv_by_std_in_grpo=False)
            loss_fn, agg = get_policy_loss_fn("vanilla"), "seq-mean-token-sum-norm"
        loss, _ = loss_fn(
            old_log_prob=old,
            log_prob=policy.token_logprobs(seqs),
            advantages=adv,
            response_mask=mask.bool(),
            loss_agg_mode=agg,
            config=LossConfig(groups * k),
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * (1 - step / steps) + 0.002
    with torch.no_grad():
        target = torch.log_softmax(ref.seq_logprobs_all() + reward_table / BETA, 0)
        learned = policy.seq_logprobs_all()
        return float((target.exp() * (target - learned)).sum())


def test_tb_matches_target_off_policy_while_dr_grpo_does_not():
    kl_tb = train("tb")
    kl_drgrpo = train("drgrpo")
    print(f"KL(target || policy): tb {kl_tb:.2e}, Dr. GRPO {kl_drgrpo:.3f}")
    assert kl_tb < 0.02
    assert kl_drgrpo > 5 * max(kl_tb, 0.02)
