"""The fused TB update against the three-call path on one GPU, both through verl's actor and reference workers and
its FSDP engine in one process (``engine_update``; no Ray, no TransferQueue).

    python benchmarks/trainer_passes_gpu.py [--size 0.5b|tiny] [--device cuda|cpu] [--groups 4] [--group-size 16]
                                            [--prompt-len 128] [--response-len 1024] [--updates 5] [--repeats 3]

What ``benchmarks/trainer_passes.py`` measures through a whole verl run on CPU, at the size TBA's users train: a
Qwen2 model built from a config (Qwen2.5-0.5B's shape, random weights, bf16 forward over float32 weights as verl
trains), ``--groups`` prompt groups of ``--group-size`` (K) responses of up to ``--response-len`` tokens per
optimizer update, random tokens and rewards, the actor moved away from the reference (``Workers.drift``), the
reference log-probs stored with the data (computed once by verl's reference worker, as the searcher's are). verl's
engine cuts each call into micro-batches (``prepare_micro_batches``) of one prompt group in both paths. Per update:
- three_call (verl's pipeline without tba-ext's fused update): ``compute_log_prob`` (old log-probs, with the entropy
  verl's trainer asks for), ``compute_ref_log_prob``, the KL-in-reward score and the registered ``tb`` estimator on
  the host, then ``update_actor`` with verl's ``ppo_loss`` (loss_mode tb): 5 forward units per trajectory;
- fused (``tba.fused_update``): ``update_actor`` with tba-ext's ``fused_tb_loss`` (log Z the detached group mean of
  the same forward; group ids in the batch's ``tba_group``, moved to the device by verl with the micro-batch): 3 units.
Both end in verl's optimizer step (AdamW, grad_clip 1). Before timing, both paths' loss and gradient before the clip
are compared at theta = old (learning rate 0 for those two updates), where they are the same function (App. A):
``check_at_old``. Timed: seconds per update after ``--warmup`` updates, the paths alternating by repeat; medians with
min-max. Writes ``benchmarks/results/trainer_passes_gpu.json`` with ``trainer_s_fused_vs_three_call`` and the peak
memory of each path. ``--size tiny --device cpu`` runs in seconds (the test suite's check of this
script). Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_update

FORWARD_UNITS = {"three_call": 5, "fused": 3}  # per trajectory: a forward 1, a forward + backward 3


def padded(nested: torch.Tensor) -> torch.Tensor:
    return torch.nested.to_padded_tensor(nested, 0.0)


def tb_advantages(batch, old: torch.Tensor, ref: torch.Tensor, algorithm) -> torch.Tensor:
    """verl's KL-in-reward score (k1 per token, ``kl_penalty``) and the registered ``tb`` estimator over the
    prompt uids, on the host: the advantage, nested like the responses."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, kl_penalty
    from verl.workers.utils.padding import response_to_nested

    mask = padded(batch["response_mask"]).float()
    kl = kl_penalty(padded(old).cpu(), padded(ref).cpu(), kl_penalty="kl")
    score = padded(batch["rm_scores"]) - float(algorithm.kl_ctrl.kl_coef) * kl * mask
    uids = np.array(list(batch["uid"]), dtype=object)
    advantage, _ = get_adv_estimator_fn("tb")(
        token_level_rewards=score, response_mask=mask, index=uids, config=algorithm
    )
    return response_to_nested(advantage, batch["response_mask"])


def three_call_update(workers, batch, algorithm, group_size: int, keep_gradient: bool = False) -> dict:
    """verl's three calls (old log-probs, reference log-probs, update with ppo_loss), the advantage between."""
    old = workers.log_probs(batch, "actor", calculate_entropy=True)
    ref = workers.log_probs(batch, "ref")
    data = batch.copy()
    data["old_log_probs"], data["ref_log_prob"] = old.cpu(), ref.cpu()
    data["advantages"] = tb_advantages(batch, old, ref, algorithm)
    workers.set_loss(workers.ppo_loss)
    return workers.update(
        engine_update.update_batch(data, "three_call", group_size, reference_in_update=False), keep_gradient
    )


def fused_update(workers, batch, group_size: int, micro_groups: int = 1, keep_gradient: bool = False) -> dict:
    """One verl call: the update with the fused loss, the reference log-probs stored with the data."""
    workers.set_loss(workers.fused_loss)
    data = engine_update.update_batch(batch, "tb", group_size, micro_groups, reference_in_update=False)
    return workers.update(data, keep_gradient)


def check_at_old(workers, batch, algorithm, group_size: int, micro_groups: int = 1) -> dict:
    """Both paths at theta = old (learning rate 0: neither update moves the weights): their losses and gradients
    before verl's clip, relative differences."""
    with workers.frozen():
        fused = fused_update(workers, batch, group_size, micro_groups, keep_gradient=True)
    grad_fused = engine_update.flat(workers.gradient)
    with workers.frozen():
        three = three_call_update(workers, batch, algorithm, group_size, keep_gradient=True)
    grad_three = engine_update.flat(workers.gradient)
    return {
        "loss_fused": fused["loss"],
        "loss_three_call": three["loss"],
        "loss_rel_diff": abs(fused["loss"] - three["loss"]) / max(abs(three["loss"]), 1e-30),
        "grad_rel_diff": engine_update.relative(grad_fused, grad_three),
    }


def with_stored_reference(workers, batch):
    """``batch`` with its reference log-probs from verl's reference worker (the searcher's, in a run)."""
    from tba_ext.core.wire import TODO_FIELD

    batch = batch.exclude(TODO_FIELD)
    batch["ref_log_prob"] = workers.log_probs(batch, "ref").cpu()
    return batch


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_updates(path, workers, batch, algorithm, args) -> list[float]:
    seconds = []
    for i in range(args.warmup + args.updates):
        sync(args.device)
        start = time.perf_counter()
        if path == "fused":
            fused_update(workers, batch, args.group_size)
        else:
            three_call_update(workers, batch, algorithm, args.group_size)
        sync(args.device)
        if i >= args.warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure(workers, batch, algorithm, args) -> tuple[dict, dict]:
    """Seconds per update of each path (per repeat, the median of its updates) and its peak device memory."""
    seconds: dict[str, list[float]] = {"three_call": [], "fused": []}
    peak_bytes = dict.fromkeys(seconds, 0)
    for repeat in range(args.repeats):
        order = list(seconds) if repeat % 2 == 0 else list(seconds)[::-1]  # alternate: drifts reach both alike
        for path in order:
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            seconds[path].append(statistics.median(timed_updates(path, workers, batch, algorithm, args)))
            if args.device.startswith("cuda"):
                peak_bytes[path] = max(peak_bytes[path], torch.cuda.max_memory_allocated())
            print(f"repeat {repeat + 1}/{args.repeats} {path}: {seconds[path][-1]:.3f} s/update", flush=True)
    return seconds, peak_bytes


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(engine_update.SIZES), default="0.5b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        choices=sorted(engine_update.VERL_DTYPE),
        help="the forward's; default bfloat16 on cuda, else float32",
    )
    parser.add_argument("--groups", type=int, default=4, help="prompt groups per optimizer update")
    parser.add_argument("--group-size", type=int, default=16, help="K responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--updates", type=int, default=5, help="timed updates per path and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/trainer_passes_gpu.json")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")

    started = time.time()
    sizes = (args.groups, args.group_size, args.response_len, 1e-6)
    with engine_update.built("cpu_tb", args.size, args.device, args.dtype, *sizes) as (workers, config, _):
        vocab = engine_update.SIZES[args.size]["vocab_size"]
        batch = engine_update.make_batch(args.groups, args.group_size, args.prompt_len, args.response_len, vocab)
        batch = with_stored_reference(workers, batch)
        check = check_at_old(workers, batch, config.algorithm, args.group_size)
        print(f"at theta = old: loss rel diff {check['loss_rel_diff']:.2e}, grad rel diff {check['grad_rel_diff']:.2e}")
        seconds, peak_bytes = measure(workers, batch, config.algorithm, args)
        parameters = sum(p.numel() for p in workers.module.parameters())

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
            f"benchmarks/trainer_passes_gpu.py: Qwen2 {args.size} from a config, random weights, {args.dtype} "
            f"forward, {args.groups} groups x K={args.group_size} x ({args.prompt_len} prompt + up to "
            f"{args.response_len} response) tokens per update, verl's actor and reference workers in one process, "
            f"one group per micro-batch, AdamW; per repeat the median of {args.updates} updates after "
            f"{args.warmup} warm-up; {args.repeats} repeats, paths alternating; medians with min-max"
        ),
        "provenance": engine_update.provenance(args.device),
        "parameters": parameters,
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
