"""The fused TB update against the three-call path on one GPU, with plain torch + ``tba_ext.core`` (no verl, no Ray).

    python benchmarks/trainer_passes_gpu.py [--size 0.5b|tiny] [--device cuda|cpu] [--groups 4] [--group-size 16]
                                            [--prompt-len 128] [--response-len 1024] [--updates 5] [--repeats 3]

What ``benchmarks/trainer_passes.py`` measures through verl on CPU, at the size TBA's users train: a Qwen2 model
built from a config (Qwen2.5-0.5B's shape, random weights, bf16), ``--groups`` prompt groups of ``--group-size`` (K)
responses of ``--response-len`` tokens per optimizer update, random tokens and rewards, the reference log-probs
stored with the data (the searcher computed them). One micro-batch is one prompt group in both paths. Per update:
- three_call (verl's pipeline without tba-ext's fused update): a no-grad forward of every group for the old
  log-probs, a no-grad forward of the reference model, the TB advantage on the host (``tb_advantage``), then a
  forward + backward of every group with ``tb_loss_from_advantage``: 5 forward units per trajectory;
- fused (``tba.fused_update``, the reference trainer's work): a forward + backward of every group with
  ``vargrad_tb_loss`` (log Z the detached group mean of the same forward): 3 units.
Both end in one AdamW step. Before timing, both paths' loss and gradient are compared at theta = old, where they
are the same function (App. A): ``check_at_old``. Timed: seconds per update after ``--warmup`` updates, the paths
alternating by repeat; medians with min-max. Writes ``benchmarks/results/trainer_passes_gpu.json`` with
``trainer_s_fused_vs_three_call`` and the peak memory of each path. ``--size tiny --device cpu`` runs in seconds
(the test suite's check of this script).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the checkout, not installed
from tba_ext.core.tb import (
    group_ids,
    sequence_logprob,
    tb_advantage,
    tb_loss_from_advantage,
    vargrad_tb_loss,
)

# Qwen2.5-0.5B's shape (its config.json); tiny: the CPU check of this script
SIZES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}
BETA = 0.05
FORWARD_UNITS = {"three_call": 5, "fused": 3}  # per trajectory: a forward 1, a forward + backward 3


def build_model(size: str, dtype: torch.dtype, device: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SIZES[size], max_position_embeddings=8192, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def make_groups(n_groups, group_size, prompt_len, response_len, vocab, device, seed=1):
    """Random prompt groups: (input_ids (K, P + T), response_mask (K, T), reward (K,)) each, K responses sharing a
    prompt; response lengths vary within a group so the mask matters."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n_groups):
        prompt = torch.randint(vocab, (1, prompt_len), generator=g).expand(group_size, -1)
        response = torch.randint(vocab, (group_size, response_len), generator=g)
        lengths = torch.randint(response_len // 2, response_len + 1, (group_size,), generator=g)
        mask = (torch.arange(response_len)[None, :] < lengths[:, None]).float()
        reward = torch.randint(0, 2, (group_size,), generator=g).float()
        groups.append(
            {
                "input_ids": torch.cat([prompt, response], 1).to(device),
                "mask": mask.to(device),
                "reward": reward.to(device),
            }
        )
    return groups


def response_logprob(model, input_ids, response_len):
    """Sequence-level inputs -> per-token log-probs of the response tokens (K, T), in float32."""
    logits = model(input_ids=input_ids).logits[:, -response_len - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, input_ids[:, -response_len:, None]).squeeze(-1)


def seq_logprob(model, group, response_len):
    return sequence_logprob(response_logprob(model, group["input_ids"], response_len), group["mask"])


@torch.no_grad()
def stored_reference(ref_model, groups, response_len):
    """The reference log-probs the searcher stores with each trajectory (computed once, outside the timing)."""
    for group in groups:
        group["ref_seq"] = seq_logprob(ref_model, group, response_len)


def fused_backward(model, groups, response_len, n_total):
    """One forward + backward per group of eq. 5 with log Z from the same forward; returns the batch-mean loss."""
    total = 0.0
    for group in groups:
        policy = seq_logprob(model, group, response_len)
        ids = torch.zeros(len(policy), dtype=torch.long, device=policy.device)  # one group per micro-batch
        loss, _ = vargrad_tb_loss(policy, group["ref_seq"], group["reward"], ids, BETA)
        (loss.sum() / n_total).backward()
        total += float(loss.detach().sum()) / n_total
    return total


def three_call_backward(model, ref_model, groups, response_len, n_total):
    """verl's three calls: old log-probs (no grad), reference log-probs (no grad), the advantage on the host from
    the KL-in-reward score, then one forward + backward per group of the advantage-form loss."""
    with torch.no_grad():
        old = [seq_logprob(model, group, response_len) for group in groups]
        ref = [seq_logprob(ref_model, group, response_len) for group in groups]
    old_all, ref_all = torch.cat(old).cpu(), torch.cat(ref).cpu()
    reward = torch.cat([group["reward"] for group in groups]).cpu()
    ids = group_ids([i for i, group in enumerate(groups) for _ in range(len(group["reward"]))])
    advantage, _ = tb_advantage(reward - BETA * (old_all - ref_all), ids, BETA)
    advantage = advantage.to(old[0].device).split([len(o) for o in old])
    total = 0.0
    for group, old_seq, adv in zip(groups, old, advantage):
        loss = tb_loss_from_advantage(seq_logprob(model, group, response_len), old_seq, adv)
        (loss.sum() / n_total).backward()
        total += float(loss.detach().sum()) / n_total
    return total


def gradient(model):
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def check_at_old(model, ref_model, groups, response_len, n_total) -> dict:
    """Both paths at theta = old (no step between): their losses and gradients, relative differences."""
    model.zero_grad(set_to_none=True)
    loss_fused = fused_backward(model, groups, response_len, n_total)
    grad_fused = gradient(model)
    model.zero_grad(set_to_none=True)
    loss_three = three_call_backward(model, ref_model, groups, response_len, n_total)
    grad_three = gradient(model)
    model.zero_grad(set_to_none=True)
    return {
        "loss_fused": loss_fused,
        "loss_three_call": loss_three,
        "loss_rel_diff": abs(loss_fused - loss_three) / max(abs(loss_three), 1e-30),
        "grad_rel_diff": float((grad_fused - grad_three).norm() / grad_three.norm().clamp_min(1e-30)),
    }


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_updates(path, model, ref_model, optimizer, groups, args, n_total) -> list[float]:
    seconds = []
    for i in range(args.warmup + args.updates):
        sync(args.device)
        start = time.perf_counter()
        if path == "fused":
            fused_backward(model, groups, args.response_len, n_total)
        else:
            three_call_backward(model, ref_model, groups, args.response_len, n_total)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(args.device)
        if i >= args.warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def provenance(device) -> dict:
    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "commit": git("rev-parse", "HEAD"),  # None where the tree travelled without .git
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--groups", type=int, default=4, help="prompt groups per optimizer update")
    parser.add_argument("--group-size", type=int, default=16, help="K responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--updates", type=int, default=5, help="timed updates per path and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/trainer_passes_gpu.json")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    started = time.time()
    model = build_model(args.size, dtype, args.device)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # the SFT model: a frozen copy
    groups = make_groups(
        args.groups, args.group_size, args.prompt_len, args.response_len, model.config.vocab_size, args.device
    )
    n_total = args.groups * args.group_size
    stored_reference(ref_model, groups, args.response_len)
    check = check_at_old(model, ref_model, groups, args.response_len, n_total)
    print(f"at theta = old: loss rel diff {check['loss_rel_diff']:.2e}, grad rel diff {check['grad_rel_diff']:.2e}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    seconds: dict[str, list[float]] = {"three_call": [], "fused": []}
    peak_bytes = dict.fromkeys(seconds, 0)
    for repeat in range(args.repeats):
        order = list(seconds) if repeat % 2 == 0 else list(seconds)[::-1]  # alternate: drifts reach both alike
        for path in order:
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            run = timed_updates(path, model, ref_model, optimizer, groups, args, n_total)
            seconds[path].append(statistics.median(run))
            if args.device.startswith("cuda"):
                peak_bytes[path] = max(peak_bytes[path], torch.cuda.max_memory_allocated())
            print(f"repeat {repeat + 1}/{args.repeats} {path}: {seconds[path][-1]:.3f} s/update", flush=True)

    paths = {
        path: {
            "s_per_update": spread(values),
            "forward_units_per_trajectory": FORWARD_UNITS[path],
            "peak_memory_gib": peak_bytes[path] / 2**30 if args.device.startswith("cuda") else None,
        }
        for path, values in seconds.items()
    }
    result = {
        "how": (
            f"benchmarks/trainer_passes_gpu.py: Qwen2 {args.size} from a config, random weights, {args.dtype}, "
            f"{args.groups} groups x K={args.group_size} x ({args.prompt_len} prompt + {args.response_len} response) "
            f"tokens per update, one group per micro-batch, AdamW; per repeat the median of {args.updates} updates "
            f"after {args.warmup} warm-up; {args.repeats} repeats, paths alternating; medians with min-max"
        ),
        "provenance": provenance(args.device),
        "parameters": sum(p.numel() for p in model.parameters()),
        "check_at_old": check,
        "paths": paths,
        "trainer_s_fused_vs_three_call": paths["fused"]["s_per_update"]["median"]
        / paths["three_call"]["s_per_update"]["median"],
        "wall_s": time.time() - started,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"fused {paths['fused']['s_per_update']['median']:.3f} s/update vs three-call "
        f"{paths['three_call']['s_per_update']['median']:.3f}: ratio {result['trainer_s_fused_vs_three_call']:.3f}; "
        f"wrote {args.out}"
    )
    return result


if __name__ == "__main__":
    main()
