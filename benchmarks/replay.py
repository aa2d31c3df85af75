"""Replay store benchmark (synthetic, in process): insert throughput, latency to sample 256 groups, memory per
trajectory vs raw token bytes, at 1e4 / 1e5 / 1e6 trajectories.

    python benchmarks/replay.py [--sizes 10000 100000 1000000] [--out benchmarks/results/replay.json]

Goals (issue 4): sample < 10 ms at 1e6, insert >= 100k trajectories/s, memory <= 1.5x raw token bytes.
Raw token bytes = response tokens as int32, the dedup key the store keeps. Sampling is reported twice: with
the store unchanged since the previous call (derived tables cached) and right after an insert (rebuilt);
in training every step inserts, so the second figure is the one a step pays.
"""

import argparse
import gc
import json
import os
import time
import tracemalloc

import numpy as np

from tba_ext.core.replay import ReplaySampler, Trajectory, TrajectoryStore
from tba_ext.core.settings import ReplaySettings

RESPONSE_TOKENS = 256
PER_PROMPT = 100


def build(n: int, rng: np.random.Generator, measure_memory: bool):
    tokens = rng.integers(0, 32000, size=(n, RESPONSE_TOKENS), dtype=np.int32)
    keys = [row.tobytes() for row in tokens]  # what the verl adapter stores: int32 token bytes
    del tokens
    rewards = rng.random(n)
    store = TrajectoryStore(per_prompt_capacity=PER_PROMPT, capacity=n)
    gc.collect()
    if measure_memory:
        tracemalloc.start()
    start = time.perf_counter()
    for i in range(n):
        store.add(Trajectory(i // PER_PROMPT, keys[i], float(rewards[i]), i // 20_000))
    insert_s = time.perf_counter() - start
    memory = None
    if measure_memory:
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # the keys were allocated before tracing began, so `current` is the store's own overhead; add them back
        memory = current + sum(len(k) for k in keys)
    return store, insert_s, memory


def run(sizes, groups, k, repeats, measure_memory):
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        store, insert_s, memory = build(n, rng, measure_memory)
        sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.5, reward_inv_temp=1.0, reward_mix=0.5,
                                                      max_staleness=None, seed=0))
        times, cold = [], []
        for i in range(repeats):
            if i % 2 == 0:  # cold: one new trajectory invalidates every table derived from the store
                store.add(Trajectory(-1 - i, b"new%d" % i, 0.5, store.newest_version()))
            t = time.perf_counter()
            sampler.sample_groups(groups, k, current_version=store.newest_version())
            (cold if i % 2 == 0 else times).append(time.perf_counter() - t)
        raw = n * RESPONSE_TOKENS * 4
        row = {
            "trajectories": n,
            "insert_per_s": n / insert_s,
            "sample_ms_median": 1000 * float(np.median(times)),
            "sample_ms_max": 1000 * float(np.max(times)),
            "sample_ms_after_insert": 1000 * float(np.median(cold)),
            "memory_bytes": memory,
            "raw_token_bytes": raw,
            "memory_over_raw": (memory / raw) if memory else None,
        }
        rows.append(row)
        print(f"{n:>9,d} trajectories | insert {row['insert_per_s']:>9,.0f}/s | sample {groups} groups "
              f"{row['sample_ms_median']:6.2f} ms, {row['sample_ms_after_insert']:.2f} ms after an insert | memory/raw "
              f"{row['memory_over_raw'] if row['memory_over_raw'] is None else round(row['memory_over_raw'], 3)}",
              flush=True)
        del store, sampler
        gc.collect()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--groups", type=int, default=256)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-memory", action="store_true", help="skip tracemalloc (it slows inserts)")
    parser.add_argument("--out", default="benchmarks/results/replay.json")
    args = parser.parse_args()
    print("memory pass (tracemalloc on):")
    mem_rows = run(args.sizes, args.groups, args.k, 3, measure_memory=not args.no_memory)
    print("speed pass (tracemalloc off):")
    rows = run(args.sizes, args.groups, args.k, args.repeats, measure_memory=False)
    for row, mem in zip(rows, mem_rows):
        row.update(memory_bytes=mem["memory_bytes"], memory_over_raw=mem["memory_over_raw"])
    goals = {"sample_ms_at_1e6": 10.0, "insert_per_s": 100_000, "memory_over_raw": 1.5}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"response_tokens": RESPONSE_TOKENS, "per_prompt": PER_PROMPT, "groups": args.groups,
                   "k": args.k, "goals": goals, "results": rows}, f, indent=2)
    print(f"\n{'trajectories':>12} | {'insert/s':>10} | {'sample ms':>9} | {'after insert':>12} | {'mem/raw':>7}")
    for r in rows:
        mem = "n/a" if r["memory_over_raw"] is None else f"{r['memory_over_raw']:.3f}"
        print(f"{r['trajectories']:>12,d} | {r['insert_per_s']:>10,.0f} | {r['sample_ms_median']:>9.2f} | "
              f"{r['sample_ms_after_insert']:>12.2f} | {mem:>7}")
    print(f"goals: {goals}; written to {args.out}")


if __name__ == "__main__":
    main()
