"""One fused TB update and one fused TBA' (tb_pg) update through verl's engine on one device, each checked at
theta = old against the loss written out in plain torch.

    python benchmarks/gpu_smoke.py --out $OUT/gpu_smoke.json [--size 0.5b|tiny] [--device cuda|cpu]
                                   [--dtype bfloat16|float32] [--groups 2] [--group-size 4] [--prompt-len 64]
                                   [--response-len 256]

Default: a Qwen2 of Qwen2.5-0.5B's shape built from a config (random weights, nothing downloaded), bf16 forward on
cuda, the actor moved away from the reference (``Workers.drift``). Each update runs as in a run
(``engine_update``): verl's actor worker with tba-ext's fused loss and the reference log-probs computed inside the
update (every row marked), verl's engine handing the loss one prompt group per micro-batch on the device, the loss
run with torch's default device set to meta so that a tensor made off the micro-batch's device fails
(``on_meta_default_device``). Checked per update, against Hugging Face models holding the actor's weights before
the update and the reference's, one forward per row (``expected_loss``): the loss, the gradient before verl's clip,
the reference log-probs the update computed; and that the loss, the grad_norm and the weights after the step are
finite and the weights moved. Writes a JSON with provenance and exits 1 when a check fails. ``--size tiny --device
cpu`` runs in seconds (the test suite's check); the bfloat16 tolerances are a first estimate, not
yet measured on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_update

# float32: both sides compute the same sums; bfloat16: the forward's rounding, a first estimate not yet measured on a
# GPU (one bf16 step of a log-prob near -12 is 0.0625)
TOLERANCE = {
    "float32": {"loss": 1e-4, "grad": 1e-3, "ref_log_prob": 1e-4},
    "bfloat16": {"loss": 5e-2, "grad": 1e-1, "ref_log_prob": 0.15},
}
ROLLOUT_NOISE = 0.3  # the searcher's log-probs: theta_0's plus this much noise (a stale policy, ratios != 1)


def forward_context(device: str, dtype: str):
    """The forward's precision as verl's mixed precision runs it: bf16 autocast over float32 weights."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, dtype))


def response_logprobs(model, batch, device: str, dtype: str) -> list[torch.Tensor]:
    """Per row, the float32 log-probs of its response tokens under ``model``: one forward of prompt + response."""
    rows = zip(batch["input_ids"].unbind(), batch["prompts"].unbind(), batch["responses"].unbind())
    out = []
    for input_ids, prompt, response in rows:
        with forward_context(device, dtype):
            logits = model(input_ids=input_ids[None].to(device)).logits[0]
        logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, response.to(device)[:, None]).squeeze(-1))
    return out


def expected_loss(mode, policy, ref, rollout, reward, uids, loss_scale_factor, is_ratio_max) -> torch.Tensor:
    """The loss of one update over the whole batch, from its definition.

    tb (eq. 5): mean over rows of (log Z_i + delta_ij)^2, delta = l_theta - l_ref - r / beta, log Z_i = -mean_j
    delta_ij detached. tb_pg: sum over rows and tokens of -min(pi_theta / pi_rollout, is_ratio_max) A_ij log
    pi_theta, A = S - mean_j S with S = r - beta (l_theta - l_ref) detached, divided by the rows and by
    loss_scale_factor (verl's seq-mean-token-sum-norm).
    """
    seq = torch.stack([lp.sum() for lp in policy])
    ref_seq = torch.stack([lp.sum() for lp in ref])
    members = {uid: [i for i, u in enumerate(uids) if u == uid] for uid in dict.fromkeys(uids)}
    if mode == "tb":
        delta = seq - ref_seq - reward / engine_update.BETA
        return sum(((delta[i] - delta[i].mean().detach()) ** 2).sum() for i in members.values()) / len(uids)
    score = (reward - engine_update.BETA * (seq - ref_seq)).detach()
    advantage = torch.empty_like(score)
    for rows in members.values():
        advantage[rows] = score[rows] - score[rows].mean()
    total = 0.0
    for lp, rollout_lp, a in zip(policy, rollout, advantage):
        ratio = torch.exp(lp - rollout_lp.to(lp.device)).detach().clamp(max=is_ratio_max)
        total = total - (ratio * a * lp).sum()
    return total / len(uids) / loss_scale_factor


def checked_update(workers, policy, ref, batch, mode: str, args, actor_config) -> dict:
    """One fused update of ``mode`` through verl, against ``expected_loss`` at the weights it started from."""
    device, dtype = args.device, args.dtype
    policy.load_state_dict(workers.weights())
    policy.zero_grad(set_to_none=True)
    policy_lp = response_logprobs(policy, batch, device, dtype)
    with torch.no_grad():
        ref_lp = response_logprobs(ref, batch, device, dtype)
    reward = torch.stack([s.sum() for s in batch["rm_scores"].unbind()]).to(device)
    loss = expected_loss(
        mode,
        policy_lp,
        ref_lp,
        batch["rollout_log_probs"].unbind(),
        reward,
        list(batch["uid"]),
        float(actor_config.loss_scale_factor),
        float(actor_config.policy_loss.is_ratio_max),
    )
    loss.backward()
    expected = float(loss.detach())
    want = {name: p.grad.float() for name, p in policy.named_parameters() if p.grad is not None}

    before = workers.weights()
    data = engine_update.update_batch(batch, mode, args.group_size)
    metrics = workers.update(data, keep_gradient=True)
    got = workers.gradient
    if sorted(got) != sorted(want):
        raise RuntimeError(f"parameter names differ: {sorted(set(got) ^ set(want))[:5]}")
    got_flat, want_flat = engine_update.flat(got).to(device), engine_update.flat(want)
    after = workers.weights()
    ref_in_update = data["ref_log_prob"].unbind()  # the update replaced the placeholders
    ref_diff = max(float((a.float().cpu() - b.cpu()).abs().max()) for a, b in zip(ref_in_update, ref_lp))
    report = {
        "loss": metrics["loss"],
        "loss_expected": expected,
        "loss_rel_diff": abs(metrics["loss"] - expected) / max(abs(expected), 1e-30),
        "grad_norm": metrics["grad_norm"],
        "grad_norm_expected": float(want_flat.norm()),
        "grad_rel_diff": engine_update.relative(got_flat, want_flat),
        "grad_cosine": float(torch.nn.functional.cosine_similarity(got_flat, want_flat, dim=0)),
        "ref_log_prob_max_abs_diff": ref_diff,
        "finite": bool(
            torch.isfinite(torch.tensor([metrics["loss"], metrics["grad_norm"]])).all()
            and all(torch.isfinite(t).all() for t in after.values() if t.is_floating_point())
        ),
        "weights_moved": any(not torch.equal(before[name], after[name]) for name in before),
        "metrics": {key: value for key, value in metrics.items() if key.startswith(("tb", "actor/"))},
    }
    tolerance = TOLERANCE[dtype]
    report["ok"] = (
        report["finite"]
        and report["weights_moved"]
        and report["loss_rel_diff"] < tolerance["loss"]
        and report["grad_rel_diff"] < tolerance["grad"]
        and ref_diff < tolerance["ref_log_prob"]
    )
    return report


def smoke(workers, model_dir: str, args) -> dict:
    """The two updates, TB then TBA' (the second starting where the first left the actor)."""
    from transformers import Qwen2ForCausalLM

    actor_config = workers.fused_loss.keywords["config"]  # the FSDPActorConfig verl built for the worker
    load = dict(attn_implementation="sdpa", torch_dtype=torch.float32)
    policy = Qwen2ForCausalLM.from_pretrained(model_dir, **load).to(args.device)
    ref = Qwen2ForCausalLM.from_pretrained(model_dir, **load).to(args.device).eval().requires_grad_(False)
    ref.load_state_dict(workers.weights("ref"))  # the reference's weights as verl holds them (in --dtype)
    batch = engine_update.make_batch(
        args.groups, args.group_size, args.prompt_len, args.response_len, policy.config.vocab_size
    )
    with torch.no_grad():
        policy.load_state_dict(workers.weights())
        start = response_logprobs(policy, batch, args.device, args.dtype)
    g = torch.Generator().manual_seed(2)
    batch["rollout_log_probs"] = engine_update.nested(
        [lp.cpu() + ROLLOUT_NOISE * torch.randn(lp.shape, generator=g) for lp in start]
    )
    workers.set_loss(engine_update.on_meta_default_device(workers.fused_loss))
    updates = {}
    for mode in ("tb", "tb_pg"):
        try:
            updates[mode] = checked_update(workers, policy, ref, batch, mode, args, actor_config)
        except Exception as error:  # reported in the JSON; the run goes on to the next update
            updates[mode] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(f"{mode}: {json.dumps(updates[mode])}", flush=True)
    return updates


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(engine_update.SIZES), default="0.5b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", choices=sorted(TOLERANCE), help="the forward's; default bfloat16 on cuda, else float32"
    )
    parser.add_argument("--groups", type=int, default=2, help="prompt groups in the update")
    parser.add_argument("--group-size", type=int, default=4, help="K responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--out", default="benchmarks/results/gpu_smoke.json")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")

    started = time.time()
    sizes = (args.groups, args.group_size, args.response_len, args.lr)
    with engine_update.built("cpu_tb_pg", args.size, args.device, args.dtype, *sizes) as (workers, _, model_dir):
        updates = smoke(workers, model_dir, args)
        parameters = sum(p.numel() for p in workers.module.parameters())
    result = {
        "how": (
            f"benchmarks/gpu_smoke.py: Qwen2 {args.size} from a config, random weights, {args.dtype} forward on "
            f"{args.device}; {args.groups} groups x K={args.group_size} x ({args.prompt_len} prompt + up to "
            f"{args.response_len} response) tokens; verl's actor and reference workers in one process, the fused "
            "loss with the reference forward in the update, one group per micro-batch; each update against the "
            "loss written out in plain torch at the weights it started from"
        ),
        "provenance": engine_update.provenance(args.device),
        "parameters": parameters,
        "tolerance": TOLERANCE[args.dtype],
        "updates": updates,
        "ok": all(update["ok"] for update in updates.values()),
        "wall_s": time.time() - started,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'ok' if result['ok'] else 'FAILED'}: wrote {args.out}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
