"""GSM8K (user-supplied copy) and GSM-symbolic (reasoning-gym, offline) in verl's parquet format.

Prompt: the reference TBA code's "[MATH TASK] Problem:\\n{question}\\n\\nSolution:\\n". Grading: math-verify by
default; ``grading="last_number"`` is the reference code's rule (last number in the response).
"""

from __future__ import annotations

import glob
import json
import os

PROMPT = "[MATH TASK] Problem:\n{question}\n\nSolution:\n"


def gold_answer(answer_field: str) -> str:
    """GSM8K's gold: the text after '####', commas removed."""
    if "####" not in answer_field:
        raise ValueError("answer has no '#### <number>' line")
    return answer_field.split("####")[-1].strip().replace(",", "")


def _row(question: str, answer: str, split: str, index: int, source: str, cot: str = "", grading: str = "math_verify"):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": PROMPT.format(question=question)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer_text": cot or answer, "grading": grading},
    }


def load_rows(source: str, split: str, limit: int | None = None, grading: str = "math_verify") -> list[dict]:
    """Rows from a GSM8K copy: a directory holding {split}.jsonl or {split}-*.parquet (the official layouts); every
    record (7473 train / 1319 test in openai/gsm8k "main"), or the first ``limit``."""
    jsonl = os.path.join(source, f"{split}.jsonl")
    parquet = sorted(glob.glob(os.path.join(source, "**", f"{split}-*.parquet"), recursive=True)) or sorted(
        glob.glob(os.path.join(source, f"{split}.parquet"))
    )
    if os.path.exists(jsonl):
        with open(jsonl) as f:
            records = [(i + 1, json.loads(line)) for i, line in enumerate(f) if line.strip()]
        where = jsonl
    elif parquet:
        import pandas as pd

        frame = pd.concat([pd.read_parquet(p) for p in parquet])
        records = [(i + 1, r) for i, r in enumerate(frame.to_dict("records"))]
        where = ",".join(parquet)
    else:
        raise FileNotFoundError(f"--source {source}: no {split}.jsonl or {split}-*.parquet found")
    rows = []
    for line, rec in records[:limit]:
        if not rec.get("question") or not rec.get("answer"):
            raise ValueError(f"{where} row {line}: missing 'question' or 'answer'")
        try:
            gold = gold_answer(rec["answer"])
        except ValueError as exc:
            raise ValueError(f"{where} row {line}: {exc}") from None
        rows.append(_row(rec["question"], gold, split, line - 1, "tba_ext/gsm8k", rec["answer"], grading))
    return rows


def symbolic_rows(split: str, size: int, seed: int) -> list[dict]:
    """GSM-symbolic problems generated offline by reasoning-gym (train and test from different seeds)."""
    try:
        import reasoning_gym as rg
    except ModuleNotFoundError as exc:
        raise ValueError("task gsm_symbolic needs reasoning-gym: pip install './tba-ext[demo]'") from exc

    data = rg.create_dataset("gsm_symbolic", size=size, seed=seed + (0 if split == "train" else 1_000_003))
    return [
        _row(
            item["question"],
            str(item["answer"]),
            split,
            i,
            "tba_ext/gsm_symbolic",
            item["metadata"].get("answer_cot", str(item["answer"])),
        )
        for i, item in enumerate(data)
    ]


def gsm8k_score(solution_str: str, ground_truth: str, rule: str = "math_verify") -> float:
    """1.0 if the response's answer equals the gold number."""
    from tba_ext.tasks.numbers import last_number, numbers_equal

    if rule == "last_number":
        return 1.0 if numbers_equal(last_number(solution_str), ground_truth) else 0.0
    from tba_ext.tasks.numbers import math_verify_equal

    answer = solution_str.split("####")[-1] if "####" in solution_str else solution_str
    return 1.0 if math_verify_equal(str(ground_truth), answer) else 0.0
