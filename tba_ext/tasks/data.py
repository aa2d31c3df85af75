"""Writes a task's train/test splits as verl parquet files (via ``datasets``) and gives tokenizer corpora."""

from __future__ import annotations

import os

TASKS = ("arith", "gsm_symbolic", "gsm8k", "tldr", "redteam")


def rows_for(task: str, split: str, size: int, seed: int, source: str | None = None) -> list[dict]:
    if task == "arith":
        from tba_ext.tasks import arith

        problems = arith.make_problems(size, seed=seed, split=split)
        return [arith.to_verl_row(p, split, i) for i, p in enumerate(problems)]
    if task == "gsm_symbolic":
        from tba_ext.tasks import gsm8k

        return gsm8k.symbolic_rows(split, size, seed)
    if task == "gsm8k":
        from tba_ext.tasks import gsm8k

        if not source:
            raise ValueError("task gsm8k reads a user-supplied copy: pass --source DIR (jsonl or parquet)")
        return gsm8k.load_rows(source, split, size)
    if task == "tldr":
        from tba_ext.tasks import tldr

        if not source:
            raise ValueError("task tldr reads a user-supplied copy: pass --source DIR (jsonl or parquet)")
        return tldr.load_rows(source, split, size)
    if task == "redteam":
        from tba_ext.tasks import redteam

        return redteam.rows(split, size, seed)
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


def write_task(task: str, out: str, train_size: int, test_size: int, seed: int, source: str | None = None) -> dict:
    from datasets import Dataset

    if train_size <= 0 or test_size <= 0:
        raise ValueError("--train-size and --test-size must be > 0")
    os.makedirs(out, exist_ok=True)
    summary = {"task": task}
    for split, size in (("train", train_size), ("test", test_size)):
        rows = rows_for(task, split, size, seed, source)
        if not rows:
            raise ValueError(f"task {task}: the {split} split is empty")
        path = os.path.join(out, f"{split}.parquet")
        Dataset.from_list(rows).to_parquet(path)
        summary[split] = {"rows": len(rows), "path": path}
    return summary


def corpus_for(task: str, seed: int, source: str | None = None) -> list[str]:
    """Tokenizer training text for a task: its prompts and answers in chat form."""
    if task == "arith":
        from tba_ext.tasks import arith

        return arith.corpus(arith.make_problems(5000, seed=seed) + arith.make_problems(500, seed=seed, split="test"))
    rows = rows_for(task, "train", 2000, seed, source)
    return [r["prompt"][0]["content"] + "\n" + r["extra_info"].get("answer_text", "") for r in rows]
