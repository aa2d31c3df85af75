"""MATH (Hendrycks et al.) and MATH-500 from a user-supplied copy, in verl's parquet format.

Layouts read (``--source DIR``): the official release (``DIR/{split}/<subject>/<id>.json``), a JSON-lines file
(``DIR/{split}.jsonl``, e.g. MATH-500's ``test.jsonl``) or Hugging Face parquet shards (``DIR/**/{split}-*.parquet``
or ``DIR/{split}.parquet``, e.g. lighteval/MATH). Each record needs ``problem`` and either ``answer`` (MATH-500) or
a ``solution`` whose last ``\\boxed{...}`` is the answer (MATH; extracted with verl's own helper). Every record of
a split is read unless a limit caps it: MATH has 7500 train / 5000 test problems.

MATH-500, the test set MATH results are usually reported on, is a fixed 500-problem subset of MATH's test split
(PRM800K's ``math_splits/test.jsonl``, published as HuggingFaceH4/MATH-500) that cannot be derived from the release
offline: point ``--test-source`` (or ``--source``, for PRM800K's ``math_splits`` with its 12000-problem
``train.jsonl``) at a copy of it.

Prompt: the problem and verl's MATH instruction ("Let's think step by step and output the final answer within
\\boxed{}."). Grading: math-verify, the response's boxed answer against the gold (``math_score``); verl's own
MATH data sources (lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500) are graded the same.
"""

from __future__ import annotations

import glob
import json
import os

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DATA_SOURCE = "tba_ext/math"
VERL_MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def gold_answer(record: dict) -> str:
    """The record's answer: ``answer`` if given, else the last ``\\boxed{}`` of its ``solution``."""
    if record.get("answer"):
        return str(record["answer"]).strip()
    from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

    boxed = last_boxed_only_string(str(record.get("solution") or ""))
    if boxed is None:
        raise ValueError("no 'answer' and no \\boxed{...} answer in 'solution'")
    return remove_boxed(boxed).strip()


def _records(source: str, split: str) -> tuple[list[tuple[int, dict]], str]:
    official = sorted(glob.glob(os.path.join(source, split, "*", "*.json")))
    jsonl = os.path.join(source, f"{split}.jsonl")
    parquet = sorted(glob.glob(os.path.join(source, "**", f"{split}-*.parquet"), recursive=True)) or sorted(
        glob.glob(os.path.join(source, f"{split}.parquet"))
    )
    if official:
        records = []
        for path in official:
            with open(path) as f:
                records.append((len(records) + 1, json.load(f)))
        return records, os.path.join(source, split)
    if os.path.exists(jsonl):
        with open(jsonl) as f:
            return [(i + 1, json.loads(line)) for i, line in enumerate(f) if line.strip()], jsonl
    if parquet:
        import pandas as pd

        frame = pd.concat([pd.read_parquet(p) for p in parquet])
        return [(i + 1, r) for i, r in enumerate(frame.to_dict("records"))], ",".join(parquet)
    raise FileNotFoundError(
        f"--source {source}: no {split}/<subject>/*.json, {split}.jsonl or {split}-*.parquet "
        "found (the MATH release, MATH-500, or Hugging Face parquet)"
    )


def load_rows(source: str, split: str, limit: int | None = None) -> list[dict]:
    records, where = _records(source, split)
    rows = []
    for line, rec in records[:limit]:
        if not rec.get("problem"):
            raise ValueError(f"{where} row {line}: missing 'problem'")
        try:
            answer = gold_answer(rec)
        except ValueError as exc:
            raise ValueError(f"{where} row {line}: {exc}") from None
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{rec['problem']} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {
                    "split": split,
                    "index": line - 1,
                    "answer_text": str(rec.get("solution") or answer),
                    "level": str(rec.get("level", "")),
                    "subject": str(rec.get("type") or rec.get("subject", "")),
                },
            }
        )
    return rows


def math_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if math-verify finds the response's final (boxed) answer equal to the gold answer."""
    from tba_ext.tasks.numbers import math_verify_equal

    return 1.0 if math_verify_equal(f"\\boxed{{{ground_truth}}}", solution_str) else 0.0
