"""Replay store benchmark (in process): sampling latency and insert rate at 1e4..1e6 trajectories, and the
bytes the store really keeps per trajectory at realistic lengths, with verl-shaped rows.

    python benchmarks/replay.py [--sizes 10000 100000 1000000] [--ledger-ids 10000000]
                                [--out benchmarks/results/replay.json]

Goals (issue 13): sampling 256 groups of K = 16 from 1e6 trajectories < 10 ms, measured right after an
insert (every training step inserts, so that is the figure a step pays); insert >= 100k trajectories/s;
bytes stored per trajectory, with its reference log-probs kept, <= 2.0x its raw token bytes ((prompt +
response tokens) x 4 bytes, int32); the ledger's books per step < 1 ms at 10 M trajectories read.

- speed pass: short responses (16 tokens) so that 1e6 trajectories fit in RAM; what is timed does not
  depend on their length (the dedup hash aside, included in the insert rate).
- footprint pass: 512 prompt / 1024 response tokens, K = 16 per prompt, each trajectory a row as verl's agent
  loop writes it (dataset fields, log-probs, rm_scores, tags...) compacted by ``tba_ext.adapters.rows``, and
  the reference log-probs the trainer (or a searcher) stores with it (``ReferenceLogProbs``); memory measured
  with tracemalloc, and the checkpoint file written by ``save_atomic``.
"""

import argparse
import gc
import json
import os
import tempfile
import time
import tracemalloc

import numpy as np
import torch
from common import provenance

from tba_ext.adapters.rows import split_row
from tba_ext.core.replay import ReplaySampler, Trajectory, TrajectoryStore, save_atomic
from tba_ext.core.settings import ReplaySettings

PER_PROMPT = 100  # the paper's per-prompt capacity
K = 16
GROUPS = 256


def speed(n: int, repeats: int, rng: np.random.Generator) -> dict:
    responses = rng.integers(0, 150_000, size=(n, 16), dtype=np.int32)
    rewards = rng.random(n)
    store = TrajectoryStore(per_prompt_capacity=PER_PROMPT, capacity=n)
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.5, reward_inv_temp=1.0, seed=0))
    # as training fills it: each weight version adds GROUPS prompts x K, prompts cycling through n / PER_PROMPT
    prompts = max(n // PER_PROMPT, 1)
    start = time.perf_counter()
    for i in range(n):
        step, slot = divmod(i, GROUPS * K)
        store.admit(Trajectory((step * GROUPS + slot // K) % prompts, responses[i], float(rewards[i]), step))
    insert_s = time.perf_counter() - start
    warm, after_insert = [], []
    version = store.newest_version()
    for i in range(repeats):
        for _ in range(K):  # one new group, as a training step admits before it samples
            store.admit(Trajectory(i % prompts, rng.integers(0, 150_000, 16, dtype=np.int32), 0.5, version))
        t = time.perf_counter()
        report = sampler.sample_groups(GROUPS, K, current_version=version)
        after_insert.append(time.perf_counter() - t)
        t = time.perf_counter()
        sampler.sample_groups(GROUPS, K, current_version=version)
        warm.append(time.perf_counter() - t)
        assert len(report.groups) == GROUPS  # (repeats where fewer prompts than groups are stored)
    return {
        "trajectories": n,
        "insert_per_s": n / insert_s,
        "sample_ms_after_insert": 1000 * float(np.median(after_insert)),
        "sample_ms_after_insert_p90": 1000 * float(np.percentile(after_insert, 90)),
        "sample_ms_warm": 1000 * float(np.median(warm)),
    }


def verl_row(prompt: torch.Tensor, response_len: int, session: int, version: int, rng) -> tuple[dict, dict]:
    """One trajectory as verl 0.9.1's V1 agent loop writes it to TransferQueue (agent_loop_tq.py)."""
    responses = torch.from_numpy(rng.integers(0, 150_000, response_len)).long()
    reward = float(rng.random() > 0.5)
    rm_scores = torch.zeros(response_len)
    rm_scores[-1] = reward
    input_ids = torch.cat([prompt, responses])
    row = {
        "prompts": prompt,
        "responses": responses,
        "response_mask": torch.ones_like(responses),
        "rollout_log_probs": torch.from_numpy(-rng.random(response_len, dtype=np.float32)),
        "rm_scores": rm_scores,
        "num_turns": 2,
        "metrics": {"generate_sequences": 1.23, "tool_calls": 0.0, "num_preempted": -1},
        "extra_fields": {
            "reward_extra_info": {"acc": reward},
            "min_global_steps": version,
            "max_global_steps": version,
        },
        "session_id": session,
        "loss_mask": torch.ones_like(responses),
        "input_ids": input_ids,
        "position_ids": torch.arange(len(input_ids)),
        "multi_modal_inputs": {},
        "raw_prompt": [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April ..."}],
        "data_source": "openai/gsm8k",
        "reward_model": {"ground_truth": "72", "style": "rule"},
        "extra_info": {"split": "train", "index": 17},
        "index": 17,
        "tools_kwargs": {},
        "interaction_kwargs": {},
        "agent_name": "single_turn_agent",
        "global_steps": version,
    }
    tag = {
        "status": "success",
        "prompt_len": len(prompt),
        "response_len": response_len,
        "seq_len": len(input_ids),
        "global_steps": version,
        "min_global_steps": version,
        "max_global_steps": version,
    }
    return row, tag


def footprint(n: int, prompt_len: int, response_len: int, rng) -> dict:
    store = TrajectoryStore(per_prompt_capacity=PER_PROMPT, capacity=n)
    gc.collect()
    tracemalloc.start()
    for i in range(n):
        prompt_id = i // K
        prompt = torch.from_numpy(np.random.default_rng(prompt_id).integers(0, 150_000, prompt_len)).long()
        row, tag = verl_row(prompt, response_len, i % K, i // 1000, rng)
        fields, response, logprobs, reward, extras = split_row(row, tag)
        traj = Trajectory(prompt_id, response, reward, i // 1000, logprobs, extras)
        store.admit(traj, prompt_payload=fields)
        store.set_reference(traj, logprobs - np.float32(rng.exponential(0.1)))
        del row, tag, fields, prompt
    gc.collect()
    stored, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    raw = n * (prompt_len + response_len) * 4
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "replay.pt")
        save_atomic(ReplaySampler(store, ReplaySettings()).state_dict(), path)
        checkpoint = os.path.getsize(path)
    return {
        "trajectories": n,
        "prompt_tokens": prompt_len,
        "response_tokens": response_len,
        "stored_bytes": stored,
        "raw_token_bytes": raw,
        "bytes_per_trajectory": stored / n,
        "raw_bytes_per_trajectory": raw / n,
        "bytes_ratio": stored / raw,
        "checkpoint_bytes": checkpoint,
        "checkpoint_ratio": checkpoint / raw,
    }


def ledger_cost(ids: int, uses_per_id: int = 2, batch: int = 512) -> dict:
    """The trajectory ledger after ``ids`` trajectories, each stored, trained on ``uses_per_id`` times and evicted
    (the store keeps few of them): the per-sample cost of its books (``counts``, every step), the bytes it adds to
    each checkpoint, and one trajectory's history (``updates_of``, the ``tba-ext ledger --id`` lookup)."""
    from tba_ext.core.ledger import TrajectoryLedger
    from tba_ext.core.sealed import pack

    ledger, update, start = TrajectoryLedger(), 0, time.perf_counter()
    for first in range(0, ids, batch):
        block = [ledger.new_id() for _ in range(min(batch, ids - first))]
        for i in block:
            ledger.stored(i)
        for _ in range(uses_per_id):
            update += 1
            ledger.trained(block, update)
        for i in block:
            ledger.evicted(i, "capacity")
    built_s = time.perf_counter() - start
    counts_ms = []
    for _ in range(20):
        t = time.perf_counter()
        ledger.counts()
        counts_ms.append(1e3 * (time.perf_counter() - t))
    t = time.perf_counter()
    saved = len(pack(ledger.state_dict()))
    save_s = time.perf_counter() - t
    t = time.perf_counter()
    ledger.updates_of(ids // 2)
    lookup_s = time.perf_counter() - t
    return {
        "ids": ids,
        "uses_per_id": uses_per_id,
        "counts_ms_median": float(np.median(counts_ms)),
        "saved_bytes": saved,
        "saved_bytes_per_id": saved / ids,
        "pack_s": save_s,
        "updates_of_s": lookup_s,
        "build_s": built_s,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger-ids", type=int, default=10_000_000, help="trajectories in the ledger pass")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--footprint-trajectories", type=int, default=20_000)
    parser.add_argument("--out", default="benchmarks/results/replay.json")
    args = parser.parse_args()
    meta = provenance()
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        row = speed(n, args.repeats, rng)
        rows.append(row)
        print(
            f"{n:>9,d} trajectories | insert {row['insert_per_s']:>9,.0f}/s | sample {GROUPS} x {K}: "
            f"{row['sample_ms_after_insert']:.2f} ms after an insert (p90 {row['sample_ms_after_insert_p90']:.2f}), "
            f"{row['sample_ms_warm']:.2f} ms warm",
            flush=True,
        )
        gc.collect()
    fp = footprint(args.footprint_trajectories, 512, 1024, rng)
    print(
        f"footprint at 512/1024 tokens: {fp['bytes_per_trajectory']:,.0f} B stored per trajectory vs "
        f"{fp['raw_bytes_per_trajectory']:,.0f} B raw tokens = {fp['bytes_ratio']:.3f}x; checkpoint "
        f"{fp['checkpoint_ratio']:.3f}x raw ({fp['checkpoint_bytes'] / 2**20:.1f} MB for {fp['trajectories']:,d})"
    )
    ledger = ledger_cost(args.ledger_ids)
    print(
        f"ledger at {ledger['ids']:,d} ids ({ledger['uses_per_id']} uses each): counts "
        f"{ledger['counts_ms_median']:.4f} ms per step, {ledger['saved_bytes'] / 2**20:.1f} MB in each checkpoint, "
        f"one id's history {ledger['updates_of_s']:.3f} s"
    )
    largest = max(rows, key=lambda r: r["trajectories"])
    summary = {
        "sample_ms_1e6": largest["sample_ms_after_insert"],
        "insert_per_s_1e6": largest["insert_per_s"],
        "bytes_ratio": fp["bytes_ratio"],
        "sampled_from": largest["trajectories"],
    }
    summary["ledger_counts_ms"] = ledger["counts_ms_median"]
    goals = {"sample_ms_1e6": 10.0, "insert_per_s_1e6": 100_000, "bytes_ratio": 2.0, "ledger_counts_ms": 1.0}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                **summary,
                "goals": goals,
                "provenance": meta,
                "groups": GROUPS,
                "k": K,
                "per_prompt": PER_PROMPT,
                "speed": rows,
                "footprint": fp,
                "ledger": ledger,
            },
            f,
            indent=2,
        )
    print(
        "\n"
        + " | ".join(
            f"{key} {summary[key]:,.3f} (goal {'<=' if key != 'insert_per_s_1e6' else '>='} {goal:,})"
            for key, goal in goals.items()
        )
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
