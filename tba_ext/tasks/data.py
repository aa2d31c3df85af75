"""Writes a task's train/test splits as verl parquet files (via ``datasets``) and gives tokenizer corpora."""

from __future__ import annotations

import os

from tba_ext.tasks import arith

TASKS = ("arith", "arith20", "arith_worked", "countdown", "gsm_symbolic", "gsm8k", "math", "tldr", "redteam")
# tasks read from a user-supplied copy: every row of a split is written unless a size caps it
SOURCED_TASKS = ("gsm8k", "math", "tldr")
# rows the generated tasks write when no size is given
GENERATED_SIZES = {"train": 2000, "test": 200}


def rows_for(task: str, split: str, size: int | None, seed: int, source: str | None = None) -> list[dict]:
    """A split's rows: a sourced task's first ``size`` rows (all of them for None), a generated task's ``size``
    problems (``GENERATED_SIZES`` for None)."""
    if size is None and task not in SOURCED_TASKS:
        size = GENERATED_SIZES[split]
    if task in arith.MAX_OPERAND:
        problems = arith.make_problems(size, seed=seed, split=split, max_operand=arith.MAX_OPERAND[task])
        return [arith.to_verl_row(p, split, i, worked=task == "arith_worked") for i, p in enumerate(problems)]
    if task == "countdown":
        from tba_ext.tasks import countdown

        return countdown.rows(split, size, seed)
    if task == "gsm_symbolic":
        from tba_ext.tasks import gsm8k

        return gsm8k.symbolic_rows(split, size, seed)
    if task == "gsm8k":
        from tba_ext.tasks import gsm8k

        if not source:
            raise ValueError("task gsm8k reads a user-supplied copy: pass --source DIR (jsonl or parquet)")
        return gsm8k.load_rows(source, split, size)
    if task == "math":
        from tba_ext.tasks import hendrycks_math

        if not source:
            raise ValueError(
                "task math reads a user-supplied copy: pass --source DIR (the MATH release, MATH-500 jsonl or parquet)"
            )
        return hendrycks_math.load_rows(source, split, size)
    if task == "tldr":
        from tba_ext.tasks import tldr

        if not source:
            raise ValueError("task tldr reads a user-supplied copy: pass --source DIR (jsonl or parquet)")
        return tldr.load_rows(source, split, size)
    if task == "redteam":
        from tba_ext.tasks import redteam

        return redteam.rows(split, size, seed)
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


def write_task(
    task: str,
    out: str,
    train_size: int | None = None,
    test_size: int | None = None,
    seed: int = 0,
    source: str | None = None,
    test_source: str | None = None,
) -> dict:
    """Write ``out/train.parquet`` and ``out/test.parquet``. A sourced task (gsm8k, math, tldr) writes every row of
    each split unless ``train_size`` / ``test_size`` caps it at its first rows; ``test_source`` reads the test split
    from another copy (MATH-500 beside the MATH training set)."""
    from datasets import Dataset

    for flag, size in (("--train-size", train_size), ("--test-size", test_size)):
        if size is not None and size <= 0:
            raise ValueError(f"{flag} must be > 0")
    if test_source and task not in SOURCED_TASKS:
        raise ValueError(f"--test-source: task {task} is generated, not read from a copy")
    os.makedirs(out, exist_ok=True)
    summary = {"task": task}
    for split, size, split_source in (("train", train_size, source), ("test", test_size, test_source or source)):
        rows = rows_for(task, split, size, seed, split_source)
        if not rows:
            raise ValueError(f"task {task}: the {split} split is empty")
        path = os.path.join(out, f"{split}.parquet")
        Dataset.from_list(rows).to_parquet(path)
        summary[split] = {"rows": len(rows), "path": path}
        if task in SOURCED_TASKS:
            summary[split]["source"] = split_source
    return summary


def corpus_for(task: str, seed: int, source: str | None = None) -> list[str]:
    """Tokenizer training text for a task: its prompts and answers in chat form."""
    if task in arith.MAX_OPERAND:
        top = arith.MAX_OPERAND[task]
        return arith.corpus(
            arith.make_problems(5000, seed=seed, max_operand=top)
            + arith.make_problems(500, seed=seed, split="test", max_operand=top),
            worked=task == "arith_worked",
        )
    if task == "countdown":
        from tba_ext.tasks import countdown

        return countdown.corpus(countdown.make_problems(5000, seed) + countdown.make_problems(500, seed, "test"))
    rows = rows_for(task, "train", 2000, seed, source)
    return [r["prompt"][0]["content"] + "\n" + r["extra_info"].get("answer_text", "") for r in rows]


# reward_kwargs each model-scored data_source needs (checked before a run starts)
REQUIRED_REWARD_KWARGS = {
    "tba_ext/tldr": ("reward_model_path",),
    "tba_ext/redteam": ("victim_model_path", "toxicity_model_path"),
}


def check_dataset(
    path: str,
    key: str,
    prompt_key: str = "prompt",
    reward_kwargs: dict | None = None,
    data_sources: tuple[str, ...] | None = None,
) -> int:
    """Refuse an empty file or a row verl would choke on later, or score as 0 without a word (no prompt, a message
    without role or content, no or a NaN ground truth, an empty one for a rule-scored row, no data_source, one
    outside ``data_sources`` where given: those the reward function scores), naming the config key, the file and
    the 1-based row; returns the number of rows."""
    import math

    import pandas as pd

    from tba_ext.tasks.scorers import check_model_path

    try:
        frame = pd.read_parquet(path)
    except Exception as exc:
        raise ValueError(f"{key}: {path} is not a readable parquet file ({exc})") from None
    if frame.empty:
        raise ValueError(f"{key}: {path} has no rows")
    for column in (prompt_key, "reward_model", "data_source"):
        if column not in frame.columns:
            named = f" (data.prompt_key={prompt_key})" if column == prompt_key else ""
            raise ValueError(f"{key}: {path} has no '{column}' column{named} (build it with `tba-ext prepare-data`)")

    def text(value) -> bool:
        return isinstance(value, str) and bool(value)

    for row, (prompt, reward, source) in enumerate(
        zip(frame[prompt_key], frame["reward_model"], frame["data_source"]), start=1
    ):
        messages = list(prompt) if prompt is not None and not isinstance(prompt, str | float) else []
        if not messages or not all(isinstance(m, dict) and text(m.get("content")) for m in messages):
            raise ValueError(f"{key}: {path} row {row}: '{prompt_key}' must be a non-empty list of chat messages")
        if not all(text(m.get("role")) for m in messages):
            raise ValueError(f"{key}: {path} row {row}: a message of '{prompt_key}' has no role")
        if not isinstance(reward, dict):
            raise ValueError(f"{key}: {path} row {row}: reward_model must hold a ground_truth, got {reward!r}")
        truth = reward.get("ground_truth")
        if truth is None or isinstance(truth, float) and math.isnan(truth):
            raise ValueError(f"{key}: {path} row {row}: missing reward_model.ground_truth (got {truth!r})")
        if truth == "" and reward.get("style") == "rule":
            raise ValueError(f"{key}: {path} row {row}: reward_model.ground_truth is empty for a rule-scored row")
        if not text(source):
            raise ValueError(f"{key}: {path} row {row}: missing data_source (got {source!r})")
        if data_sources is not None and source not in data_sources:
            raise ValueError(
                f"{key}: {path} row {row}: data_source {source!r} has no reward in tba_ext.tasks.rewards "
                f"(reward.custom_reward_function); it scores {', '.join(data_sources)}"
            )
    for source in set(frame["data_source"]):
        for kwarg in REQUIRED_REWARD_KWARGS.get(source, ()):
            check_model_path((reward_kwargs or {}).get(kwarg), kwarg)
    return len(frame)


# verl applies the tokenizer's chat template to every prompt (when it filters the dataset and in the agent loop)
# and drops a row where that fails. For a model without one (GPT-2, Pythia, RhoMath SFT) this template, given
# as ``data.apply_chat_template_kwargs.chat_template``, makes the prompt the messages' text as it is: the task
# builders write the paper's raw prompt formats into the message content.
RAW_PROMPT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# The same after the tokenizer's BOS, for a model trained on prompts that start with one (the RhoMath SFT model, a
# Llama-2 tokenizer whose plain encoding puts <s> first). transformers hands ``bos_token`` to the template and
# tokenizes the rendered text without adding special tokens, as verl's dataset filter and agent loop call it, so
# the template writes the one BOS; it renders as nothing for a tokenizer without one.
BOS_RAW_PROMPT_TEMPLATE = "{{ bos_token }}" + RAW_PROMPT_TEMPLATE
CHAT_TEMPLATE_KEY = "data.apply_chat_template_kwargs.chat_template"


def check_chat_template(tokenizer, data_config: dict) -> None:
    """Refuse a chat-formatted dataset meeting a tokenizer with no chat template and no template in the config:
    verl would drop every row while filtering and train on an empty dataset."""
    template = (data_config.get("apply_chat_template_kwargs") or {}).get("chat_template")
    if template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the tokenizer has no chat template and {CHAT_TEMPLATE_KEY} is unset: verl would drop every prompt. "
            f"Set {CHAT_TEMPLATE_KEY} to the model's prompt format, e.g. the raw text of the messages: "
            f"'{RAW_PROMPT_TEMPLATE}' (tba_ext.tasks.data.RAW_PROMPT_TEMPLATE)"
        )
