"""Greedy pass@1 of a saved model on a verl parquet split, graded by the task's reward function."""

from __future__ import annotations

import pandas as pd
import torch

from tba_ext.tasks.rewards import compute_score


def greedy_accuracy(model_dir: str, parquet_path: str, max_new_tokens: int = 8, batch_size: int = 64,
                    limit: int | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    frame = pd.read_parquet(parquet_path)
    if limit:
        frame = frame.iloc[:limit]
    if frame.empty:
        raise ValueError(f"{parquet_path}: no rows to evaluate")
    scores = []
    for start in range(0, len(frame), batch_size):
        rows = frame.iloc[start : start + batch_size]
        prompts = [tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False)
                   for p in rows["prompt"]]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for text, (_, row) in zip(texts, rows.iterrows()):
            scores.append(float(compute_score(row["data_source"], text, row["reward_model"]["ground_truth"],
                                              row["extra_info"])))
    return {"accuracy": sum(scores) / len(scores), "n": len(scores)}
