"""CPU toy task: short integer arithmetic answered with a number (verl parquet + rule reward)."""

from __future__ import annotations

import random

DATA_SOURCE = "tba_ext/arith"
INSTRUCTION = "Answer with the number only."


def is_held_out(a: int, b: int) -> bool:
    """arith: a fixed 10% of operand pairs (one per first operand) never appear in training: the test split
    asks only these, so held-out accuracy measures generalisation, not memorisation. (All of their sums are
    even: a structured hold-out, hard to generalise to.)"""
    return (a * 7 + b * 3) % 10 == 0


def held_out_pairs(max_operand: int) -> set[tuple[int, int]]:
    """The operand pairs only the test split asks. arith (0..9): ``is_held_out``. Larger ranges: a fixed
    random 20% of all pairs, so held-out sums look like training ones (both parities, every magnitude); 80
    pairs for arith20, enough that one run's held-out accuracy is not decided by a handful of problems."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if max_operand == 9:
        return {p for p in pairs if is_held_out(*p)}
    return set(random.Random(20251130).sample(pairs, len(pairs) // 5))


# task name -> largest operand: "arith" has 10 held-out pairs (0..9), "arith20" 80 (0..19, two-digit sums)
MAX_OPERAND = {"arith": 9, "arith20": 19}


def make_problems(n: int, seed: int, split: str = "train", max_operand: int = 9, ops: str = "+") -> list[dict]:
    """``n`` problems "a+b=?" with operands in [0, max_operand]; train and test use disjoint operand pairs.
    Train draws pairs at random; test goes through every held-out pair in turn (in a shuffled order), so each
    counts equally in a held-out accuracy."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    held_out = held_out_pairs(max_operand)
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)
             if ((a, b) in held_out) == (split == "test")]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    rows = []
    for i in range(n):
        (a, b) = pairs[i % len(pairs)] if split == "test" else rng.choice(pairs)
        op = rng.choice(ops)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"question": f"{a}{op}{b}=?", "answer": str(answer)})
    return rows


def to_verl_row(problem: dict, split: str, index: int) -> dict:
    """verl's RL parquet row: chat prompt, data_source, reward_model.ground_truth, extra_info."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem["answer"]},
        "extra_info": {"split": split, "index": index, "answer_text": problem["answer"]},
    }


def corpus(problems: list[dict]) -> list[str]:
    """Text the offline tokenizer is trained on: prompts and answers as they appear in chat form."""
    return [f"user\n{p['question']} {INSTRUCTION}\nassistant\n{p['answer']}\n" for p in problems]
