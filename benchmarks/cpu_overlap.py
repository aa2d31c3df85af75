"""How much two processes can overlap on this machine: the ceiling of any trainer / searcher overlap on CPU.

    python benchmarks/cpu_overlap.py [--seconds 20] [--repeats 3] [--out benchmarks/results/cpu_overlap.json]

One single-threaded worker does fixed float32 matmul work (the kind of work a small model's forward/backward is)
alone, then 2 and 3 workers do the same work at once (a trainer, a searcher, and the rest of verl's processes).
Reported per case: the median wall time of a worker and the aggregate throughput relative to one worker alone.
Two processes overlapping perfectly give 2.0x; decoupled TBA cannot beat sync by more than that ratio allows.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time


def work(size: int, reps: int, out):
    import torch

    torch.set_num_threads(1)
    a = torch.randn(size, size)
    start = time.perf_counter()
    for _ in range(reps):
        a = torch.tanh(a @ a / size)
    out.put(time.perf_counter() - start)


def run(workers: int, size: int, reps: int) -> float:
    out = mp.Queue()
    procs = [mp.Process(target=work, args=(size, reps, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    times = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--reps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/cpu_overlap.json")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    result = {"cpus": os.cpu_count(), "size": args.size, "reps": args.reps, "cases": {}}
    for workers in (1, 2, 3):
        walls = [run(workers, args.size, args.reps) for _ in range(args.repeats)]
        result["cases"][workers] = {
            "worker_wall_s_median": statistics.median(walls),
            "min": min(walls),
            "max": max(walls),
        }
        print(
            f"{workers} worker(s): {statistics.median(walls):.2f} s per worker ({min(walls):.2f}-{max(walls):.2f})",
            flush=True,
        )
    alone = result["cases"][1]["worker_wall_s_median"]
    for workers, case in result["cases"].items():
        case["throughput_vs_one"] = workers * alone / case["worker_wall_s_median"]
    result["overlap_ceiling"] = result["cases"][2]["throughput_vs_one"]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"throughput with 2 workers / 1: {result['cases'][2]['throughput_vs_one']:.2f}x; "
        f"with 3: {result['cases'][3]['throughput_vs_one']:.2f}x  -> {args.out}"
    )


if __name__ == "__main__":
    main()
