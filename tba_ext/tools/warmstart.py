"""Supervised warm start of the offline model on a task's train split (the quickstart's SFT stage).

verl's SFT trainer is a torchrun/FSDP program built for GPUs; for a 2M-parameter model on CPU the
smallest honest alternative is this plain loop: teacher-forced cross-entropy on the answer tokens of
chat-formatted (prompt, answer) pairs, AdamW, a fixed number of steps, saved with ``save_pretrained``.
"""

from __future__ import annotations

import random

import pandas as pd
import torch


def sft_examples(parquet_path: str, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + eos) pairs from a verl parquet file whose extra_info has answer_text."""
    frame = pd.read_parquet(parquet_path)
    examples = []
    for i, row in enumerate(frame.itertuples()):
        answer = row.extra_info.get("answer_text") if isinstance(row.extra_info, dict) else None
        if answer is None:
            raise ValueError(f"{parquet_path} row {i}: extra_info.answer_text is missing (needed for SFT)")
        prompt = tokenizer.apply_chat_template(list(row.prompt), add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt_ids, answer_ids))
    return examples


def warm_start(
    model_dir: str,
    train_parquet: str,
    out_dir: str,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    max_examples: int | None = None,
    log_every: int = 50,
) -> list[float]:
    """Fine-tune ``model_dir`` for ``steps`` steps and save to ``out_dir``; returns the loss curve."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples = sft_examples(train_parquet, tokenizer)[:max_examples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        attn = torch.zeros_like(ids)
        for i, (p, a) in enumerate(batch):
            seq = p + a
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            labels[i, len(p) : len(seq)] = torch.tensor(a)  # learn the answer, not the prompt
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if log_every and step % log_every == 0:
            print(f"  warm start step {step}/{steps}: loss {sum(losses[-log_every:]) / log_every:.3f}", flush=True)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses
