"""TL;DR summarisation from a user-supplied copy, scored by a user-supplied reward model.

Data: a directory holding ``{split}.jsonl`` or ``{split}*.parquet`` in one of the common layouts:
the OpenAI/CleanRL preprocessing (``query``/``prompt`` + ``reference_response``/``label``/``summary``),
TRL's ``prompt``/``completion``, or the raw ``subreddit``/``title``/``post`` + ``summary`` records.
Reward: a sequence-classification reward model (one logit) on "prompt + summary", as in the reference code.
Win rate: mean over prompts of RM(generated) > RM(reference summary), the paper's metric.
"""

from __future__ import annotations

import glob
import json
import os

DATA_SOURCE = "tba_ext/tldr"
POST_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
_PROMPT_KEYS = ("query", "prompt")
_SUMMARY_KEYS = ("reference_response", "label", "summary", "completion")


def _records(source: str, split: str) -> tuple[str, list[dict]]:
    # the TL;DR datasets call their held-out split "validation" (the paper evaluates on it)
    for name in [split] + (["validation"] if split == "test" else []):
        jsonl = os.path.join(source, f"{name}.jsonl")
        if os.path.exists(jsonl):
            with open(jsonl) as f:
                return jsonl, [json.loads(line) for line in f if line.strip()]
        parquet = sorted(glob.glob(os.path.join(source, "**", f"{name}*.parquet"), recursive=True))
        if parquet:
            import pandas as pd

            return ",".join(parquet), pd.concat([pd.read_parquet(p) for p in parquet]).to_dict("records")
    raise FileNotFoundError(f"--source {source}: no {split}.jsonl or {split}*.parquet found")


def _prompt_and_summary(rec: dict) -> tuple[str | None, str | None]:
    prompt = next((rec[k] for k in _PROMPT_KEYS if rec.get(k)), None)
    if prompt is None and rec.get("post"):
        prompt = POST_TEMPLATE.format(subreddit=rec.get("subreddit", ""), title=rec.get("title", ""), post=rec["post"])
    summary = next((rec[k] for k in _SUMMARY_KEYS if rec.get(k)), None)
    if isinstance(summary, dict):  # summarize_from_feedback stores {"text": ...}
        summary = summary.get("text")
    return prompt, summary


def load_rows(source: str, split: str, limit: int | None = None) -> list[dict]:
    """verl parquet rows; a record without a post/prompt or reference summary is refused by file and row."""
    where, records = _records(source, split)
    rows = []
    for i, rec in enumerate(records[:limit]):
        prompt, summary = _prompt_and_summary(rec)
        if not prompt or not summary:
            raise ValueError(
                f"{where} row {i + 1}: needs a prompt ({'/'.join(_PROMPT_KEYS)} or post) and a "
                f"reference summary ({'/'.join(_SUMMARY_KEYS)})"
            )
        summary = summary.strip()
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": "summarization",
                "reward_model": {"style": "model", "ground_truth": summary},
                "extra_info": {"split": split, "index": i, "answer_text": summary, "prompt_text": prompt},
            }
        )
    return rows


def rm_text(prompt: str, summary: str) -> str:
    """What the reward model reads: the post followed by the summary (the reference code's query + response)."""
    return f"{prompt} {summary.strip()}"


def win_rate(generated_scores, reference_scores) -> float:
    """Fraction of prompts where the generated summary beats the reference under the RM (ties lose)."""
    pairs = list(zip(generated_scores, reference_scores, strict=True))
    if not pairs:
        raise ValueError("win rate of zero prompts")
    return sum(g > r for g, r in pairs) / len(pairs)
