"""Countdown, the CPU's second task (and tba-prime's TBA′ task): make a target from three numbers 1-9, each used
once, with + - * / and brackets. Problems come from reasoning-gym's generator and answers are graded by its scorer.

Unlike the addition task a problem has several right answers ("4*(8-6)", "(8-6)*4"), so the number of distinct
correct answers per prompt means something, and the answer is a search over expressions, not a lookup.
"""

from __future__ import annotations

import functools
import json
import random
import re

DATA_SOURCE = "tba_ext/countdown"
CONFIG = {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 9, "min_target": 10, "max_target": 40}
TEST_SEED_OFFSET = 1_000_003  # the test pool is drawn from another seed than the training pool
HELD_OUT_SHARE = 5  # one (numbers, target) problem in 5 is asked only by the test split
# what an answer may contain before it reaches sympy: digits, operators, brackets, spaces
ANSWER_CHARS = re.compile(r"[0-9+\-*/() ]+")
# refused before sympy sees them: "**" (a power: "9**9**9" would stall the reward loop) and "//" (floor division,
# which sympy reads as such and which would make "9+7//2" a right way to 12); countdown has + - * / only
DOUBLE_OPERATOR = re.compile(r"[*/]{2}")


def _key(numbers, target) -> str:
    return f"{' '.join(map(str, sorted(numbers)))}={target}"


def is_held_out(numbers, target) -> bool:
    """A fixed share of (numbers, target) problems that training never asks: the test split asks only these, so
    held-out accuracy measures generalisation to unseen problems built from familiar numbers."""
    return random.Random(_key(numbers, target)).randrange(HELD_OUT_SHARE) == 0


def _pool(seed: int, size: int) -> list[dict]:
    import reasoning_gym as rg

    data = rg.create_dataset("countdown", size=size, seed=seed, **CONFIG)
    return [
        {
            "numbers": list(item["metadata"]["numbers"]),
            "target": int(item["metadata"]["target"]),
            "expression": item["metadata"]["expression"].replace(" ", ""),
        }
        for item in data
    ]


def make_problems(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` problems with one right expression each (reasoning-gym's). Train draws non-held-out problems at random
    (repeats allowed: their expressions differ from draw to draw); test goes through distinct held-out problems in
    turn, so each counts equally in a held-out accuracy."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    pool_seed = seed if split == "train" else seed + TEST_SEED_OFFSET
    pool = [
        p
        for p in _pool(pool_seed, max(2 * n, 2000) if split == "train" else 4000)
        if is_held_out(p["numbers"], p["target"]) == (split == "test")
    ]
    if split == "train":
        return random.Random(seed).choices(pool, k=n)
    distinct = list({_key(p["numbers"], p["target"]): p for p in pool}.values())
    random.Random(seed).shuffle(distinct)
    return [distinct[i % len(distinct)] for i in range(n)]


def prompt(problem: dict) -> str:
    numbers = " ".join(map(str, problem["numbers"]))
    return f"Make {problem['target']} from {numbers}, each once."


def to_verl_row(problem: dict, split: str, index: int) -> dict:
    """verl's RL parquet row; the ground truth is the numbers and target as JSON (any right expression scores)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt(problem)}],
        "ability": "math",
        "reward_model": {
            "style": "rule",
            "ground_truth": json.dumps({"numbers": problem["numbers"], "target": problem["target"]}),
        },
        "extra_info": {"split": split, "index": index, "answer_text": problem["expression"]},
    }


def rows(split: str, size: int, seed: int) -> list[dict]:
    return [to_verl_row(p, split, i) for i, p in enumerate(make_problems(size, seed, split))]


@functools.lru_cache(maxsize=1)
def _scorer():
    import reasoning_gym as rg

    return rg.create_dataset("countdown", size=1, seed=0, **CONFIG)


def countdown_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response is an expression that uses exactly the given numbers and equals the target
    (reasoning-gym's scorer gives 1.0 only then), else 0.0."""
    answer = solution_str.replace("<|im_end|>", "").strip()
    if not ANSWER_CHARS.fullmatch(answer) or DOUBLE_OPERATOR.search(answer):
        return 0.0
    truth = json.loads(ground_truth)
    entry = {"metadata": {"numbers": truth["numbers"], "target": truth["target"]}}
    return 1.0 if _scorer().score_answer(answer, entry) == 1.0 else 0.0


def corpus(problems: list[dict]) -> list[str]:
    """Text the offline tokenizer is trained on: prompts and answers as they appear in chat form."""
    return [f"user\n{prompt(p)}\nassistant\n{p['expression']}\n" for p in problems]
