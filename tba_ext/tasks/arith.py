"""CPU toy tasks: short integer arithmetic answered with a number, or with a short worked answer that ends in
the number (verl parquet + rule reward)."""

from __future__ import annotations

import random

DATA_SOURCE = "tba_ext/arith"
INSTRUCTION = "Answer with the number only."
WORKED_SOURCE = "tba_ext/arith_worked"
WORKED_INSTRUCTION = "Show the counting, then the answer."


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


# task name -> largest operand: "arith" has 10 held-out pairs (0..9), "arith20" 80 (0..19, two-digit sums);
# "arith_worked" asks arith's problems for a worked answer
MAX_OPERAND = {"arith": 9, "arith20": 19, "arith_worked": 9}


def worked_answer(a: int, b: int, op: str = "+") -> str:
    """A worked answer of a few dozen tokens that ends in the result: the generation-bound CPU task (responses
    long enough that generation, not the trainer, sets the pace, as with GSM8K-style answers on GPUs)."""
    if op != "+":
        raise ValueError(f"arith_worked asks sums only, got operator {op!r}")
    counting = ", ".join(f"{a + i - 1}+1={a + i}" for i in range(1, b + 1)) or f"{b} adds nothing"
    return (
        f"We add {b} to {a} one at a time, starting at {a}: {counting}. So {a}+{b} is {a + b}. The answer is {a + b}."
    )


def make_problems(n: int, seed: int, split: str = "train", max_operand: int = 9, ops: str = "+") -> list[dict]:
    """``n`` problems "a+b=?" with operands in [0, max_operand]; train and test use disjoint operand pairs.
    Train draws pairs at random; test goes through every held-out pair in turn (in a shuffled order), so each
    counts equally in a held-out accuracy."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    held_out = held_out_pairs(max_operand)
    pairs = [
        (a, b)
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
        if ((a, b) in held_out) == (split == "test")
    ]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    rows = []
    for i in range(n):
        (a, b) = pairs[i % len(pairs)] if split == "test" else rng.choice(pairs)
        op = rng.choice(ops)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"question": f"{a}{op}{b}=?", "answer": str(answer)})
    return rows


def to_verl_row(problem: dict, split: str, index: int, worked: bool = False) -> dict:
    """verl's RL parquet row: chat prompt, data_source, reward_model.ground_truth, extra_info (answer_text: the
    SFT target, the worked answer for ``worked``)."""
    question, answer = problem["question"], problem["answer"]
    answer_text = worked_answer(*map(int, question.removesuffix("=?").split("+"))) if worked else answer
    return {
        "data_source": WORKED_SOURCE if worked else DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {WORKED_INSTRUCTION if worked else INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer_text": answer_text},
    }


def corpus(problems: list[dict], worked: bool = False) -> list[str]:
    """Text the offline tokenizer is trained on: prompts and answers as they appear in chat form."""
    rows = [to_verl_row(p, "train", i, worked) for i, p in enumerate(problems)]
    return [f"user\n{r['prompt'][0]['content']}\nassistant\n{r['extra_info']['answer_text']}\n" for r in rows]
