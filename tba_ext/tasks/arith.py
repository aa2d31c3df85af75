"""CPU toy task: short integer arithmetic answered with a number (verl parquet + rule reward)."""

from __future__ import annotations

import random

DATA_SOURCE = "tba_ext/arith"
INSTRUCTION = "Answer with the number only."


def is_held_out(a: int, b: int) -> bool:
    """A fixed 10% of operand pairs (one per first operand) never appear in training: the test split asks
    only these, so held-out accuracy measures generalisation, not memorisation."""
    return (a * 7 + b * 3) % 10 == 0


def make_problems(n: int, seed: int, split: str = "train", max_operand: int = 9, ops: str = "+") -> list[dict]:
    """``n`` problems "a+b=?" with operands in [0, max_operand]; train and test use disjoint operand pairs."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)
             if is_held_out(a, b) == (split == "test")]
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        (a, b), op = rng.choice(pairs), rng.choice(ops)
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
