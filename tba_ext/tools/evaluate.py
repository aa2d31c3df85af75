"""Evaluation of a saved policy on a verl parquet split: greedy pass@1 (arith, GSM8K, GSM-symbolic),
win rate against the reference summaries (TL;DR), attack success rate and diversity (red-teaming)."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable

import pandas as pd
import torch

from tba_ext.tasks.rewards import compute_score


def load_reward_fn(spec: str) -> Callable:
    """``PATH:NAME`` (a file or ``pkg://module``, as verl's ``custom_reward_function.path`` / ``.name``) loaded
    with verl's own loader, so ``evaluate`` scores with exactly the function training used."""
    from verl.utils.import_utils import load_extern_object

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"--reward-fn: expected PATH:NAME (e.g. my_reward.py:compute_score), got {spec!r}")
    return load_extern_object(module_path=path, object_name=name)


def reward_value(score_fn: Callable, data_source, text: str, ground_truth, extra_info) -> float:
    """One score in verl's convention: a number, or a dict with ``score``; async functions are awaited."""
    value = score_fn(data_source, text, ground_truth, extra_info)
    if inspect.isawaitable(value):
        value = asyncio.run(value)
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"the reward function returned a dict without 'score': {sorted(value)}")
        value = value["score"]
    return float(value)


def read_split(parquet_path: str, limit: int | None = None) -> pd.DataFrame:
    frame = pd.read_parquet(parquet_path)
    if limit:
        frame = frame.iloc[:limit]
    if frame.empty:
        raise ValueError(f"{parquet_path}: no rows to evaluate")
    return frame


@torch.no_grad()
def generate(
    model_dir: str, chats: list, max_new_tokens: int, batch_size: int = 64, sample: bool = False, seed: int = 0
) -> list[str]:
    """The policy's responses to verl chat prompts: greedy, or sampled at temperature 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    texts = []
    for start in range(0, len(chats), batch_size):
        prompts = [
            tokenizer.apply_chat_template(list(c), add_generation_prompt=True, tokenize=False)
            for c in chats[start : start + batch_size]
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            top_k=0 if sample else None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


PASS_AT = (1, 2, 4, 8)


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k of one prompt from ``n`` samples of which ``correct`` are right (Chen et al. 2021, eq. 1):
    1 - C(n - c, k) / C(n, k), the chance that k of the n drawn without replacement hold a right one."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def diversity(texts: list[str], rewards: list[float], samples: int) -> dict:
    """Per prompt (``samples`` consecutive entries each): pass@k for the k in PASS_AT up to ``samples`` (a reward
    of 1 counts as right), and the number of distinct right responses (whitespace-stripped), averaged over
    prompts."""
    prompts = range(0, len(texts), samples)
    right = [[t.strip() for t, r in zip(texts[i : i + samples], rewards[i : i + samples]) if r >= 1.0] for i in prompts]
    out = {f"pass@{k}": sum(pass_at_k(samples, len(r), k) for r in right) / len(right) for k in PASS_AT if k <= samples}
    out["distinct_correct_per_prompt"] = sum(len(set(r)) for r in right) / len(right)
    return out


def greedy_accuracy(
    model_dir: str,
    parquet_path: str,
    max_new_tokens: int = 8,
    batch_size: int = 64,
    limit: int | None = None,
    samples: int = 0,
    seed: int = 0,
    score_fn: Callable = compute_score,
) -> dict:
    """Greedy pass@1 over the split (mean reward of ``score_fn``, the built-in tasks' by default); with
    ``samples`` > 0 also ``sampled_accuracy``, the mean reward of that many temperature-1 samples per prompt (the
    expected reward RL optimises: far less coarse than greedy on a few distinct prompts), and their ``diversity``
    (pass@k, distinct right answers per prompt)."""
    frame = read_split(parquet_path, limit)
    rows = [row for _, row in frame.iterrows()]

    def score(texts, repeat=1):
        return [
            reward_value(score_fn, row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
            for text, row in zip(texts, [r for r in rows for _ in range(repeat)])
        ]

    greedy = score(generate(model_dir, list(frame["prompt"]), max_new_tokens, batch_size))
    result = {"accuracy": sum(greedy) / len(greedy), "n": len(greedy)}
    if samples:
        chats = [c for c in frame["prompt"] for _ in range(samples)]
        texts = generate(model_dir, chats, max_new_tokens, batch_size * samples, sample=True, seed=seed)
        sampled = score(texts, samples)
        result["sampled_accuracy"] = sum(sampled) / len(sampled)
        result["diversity"] = diversity(texts, sampled, samples)
    return result


def tldr_win_rate(
    model_dir: str, parquet_path: str, reward_model_path: str, max_new_tokens: int = 128, limit: int | None = None
) -> dict:
    """Greedy summaries scored by the reward model against the reference summaries (the paper's win rate)."""
    from tba_ext.tasks.scorers import check_model_path, reward_model_scores
    from tba_ext.tasks.tldr import rm_text, win_rate

    check_model_path(reward_model_path, "reward_model_path")
    frame = read_split(parquet_path, limit)
    summaries = generate(model_dir, list(frame["prompt"]), max_new_tokens)
    posts = [extra["prompt_text"] for extra in frame["extra_info"]]
    generated = reward_model_scores(reward_model_path, [rm_text(p, s) for p, s in zip(posts, summaries)])
    reference = reward_model_scores(
        reward_model_path, [rm_text(p, extra["answer_text"]) for p, extra in zip(posts, frame["extra_info"])]
    )
    return {
        "win_rate": win_rate(generated, reference),
        "n": len(summaries),
        "mean_reward": sum(generated) / len(generated),
        "mean_reference_reward": sum(reference) / len(reference),
    }


def redteam_eval(
    model_dir: str,
    parquet_path: str,
    victim_model_path: str,
    toxicity_model_path: str,
    max_new_tokens: int = 32,
    limit: int | None = None,
    embedder: str | None = None,
    threshold: float = 0.5,
    seed: int = 0,
) -> dict:
    """Sampled attacks (temperature 1, as the attacker is used): attack success rate and diversity."""
    from tba_ext.tasks.redteam import attack_success_rate, diversity, toxicity_rewards
    from tba_ext.tasks.scorers import check_model_path

    check_model_path(victim_model_path, "victim_model_path")
    check_model_path(toxicity_model_path, "toxicity_model_path")
    frame = read_split(parquet_path, limit)
    attacks = generate(model_dir, list(frame["prompt"]), max_new_tokens, sample=True, seed=seed)
    toxicity, _ = toxicity_rewards(attacks, victim_model_path, toxicity_model_path)
    return {
        "attack_success_rate": attack_success_rate(toxicity, threshold),
        "n": len(attacks),
        "mean_toxicity": sum(toxicity) / len(toxicity),
        "diversity": diversity(attacks, embedder),
    }
