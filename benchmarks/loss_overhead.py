"""Actor-update cost of the tb loss vs verl's vanilla (PPO-clip) loss, same batches, same process.

    python benchmarks/loss_overhead.py [--out benchmarks/results/loss_overhead.json]

Each update = forward of a Qwen2 model on a padded batch, per-token log-probs, the registered verl loss,
backward, AdamW step (what verl's actor does per micro-batch). The two losses alternate over the same
batches so machine noise hits both alike; goal (issue 3): tb / vanilla <= 1.05.
"""

import argparse
import json
import os
import statistics
import time

import torch
import verl  # noqa: F401
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn


class LossConfig:
    def __init__(self, n):
        self.global_batch_info = {
            "dp_size": 1,
            "global_batch_size": n,
            "batch_num_tokens": None,
            "loss_scale_factor": None,
        }
        self.policy_loss = OmegaConf.create({"loss_mode": "vanilla", "loss_scale": 1.0, "is_ratio_max": 8.0})
        self.clip_ratio = self.clip_ratio_low = self.clip_ratio_high = 0.2
        self.clip_ratio_c = 3.0

    def get(self, key, default=None):
        return getattr(self, key, default)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="benchmarks/results/loss_overhead.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=512,
            hidden_size=192,
            num_hidden_layers=4,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=512,
            tie_word_embeddings=False,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    b, t = args.batch, args.prompt + args.response
    batches = []
    for _ in range(4):
        ids = torch.randint(0, 512, (b, t))
        mask = torch.ones(b, args.response)
        for i in range(b):
            mask[i, torch.randint(8, args.response + 1, (1,)).item() :] = 0
        old = -torch.rand(b, args.response) * 3
        adv = torch.randn(b, 1) * mask
        batches.append((ids, mask, old, adv))
    config = LossConfig(b)
    timings = {"tb": [], "vanilla": []}
    for step in range(args.steps + 2):
        ids, mask, old, adv = batches[step % len(batches)]
        for mode in ("tb", "vanilla") if step % 2 == 0 else ("vanilla", "tb"):
            start = time.perf_counter()
            logits = model(ids).logits[:, args.prompt - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, args.prompt :, None]).squeeze(-1)
            loss, _ = get_policy_loss_fn(mode)(
                old_log_prob=old,
                log_prob=logp,
                advantages=adv,
                response_mask=mask.bool(),
                loss_agg_mode="token-mean",
                config=config,
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step >= 2:  # warm-up
                timings[mode].append(time.perf_counter() - start)
    tb_s, van_s = statistics.median(timings["tb"]), statistics.median(timings["vanilla"])
    result = {
        "batch": b,
        "tokens": t,
        "median_update_s": {"tb": tb_s, "vanilla": van_s},
        "ratio_tb_over_vanilla": tb_s / van_s,
        "goal": 1.05,
        "steps": args.steps,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'loss':<8} | median update (s)\n{'tb':<8} | {tb_s:.4f}\n{'vanilla':<8} | {van_s:.4f}")
    print(f"ratio tb / vanilla = {tb_s / van_s:.3f} (goal <= 1.05); written to {args.out}")


if __name__ == "__main__":
    main()
