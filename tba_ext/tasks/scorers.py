"""User-supplied transformers models that score text: a reward model, a toxicity classifier, a victim LM.

Loaded once per process (verl's reward workers call the reward function per sample) and run on CPU in fp32
unless a GPU is present. Paths are validated here so a wrong path names the reward_kwargs key.
"""

from __future__ import annotations

import functools
import os

import torch

REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"


def check_model_path(path: str | None, kwarg: str) -> str:
    if not path:
        raise ValueError(f"{REWARD_KWARGS}.{kwarg} is required for this task (a saved transformers model dir)")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{REWARD_KWARGS}.{kwarg}: no saved transformers model at {path}")
    return path


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=4)
def load_classifier(path: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(_device()).eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


@functools.lru_cache(maxsize=2)
def load_causal_lm(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(_device()).eval()
    return tokenizer, model


@torch.no_grad()
def classifier_logits(path: str, texts: list[str], max_length: int = 512) -> torch.Tensor:
    tokenizer, model = load_classifier(path)
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    return model(**enc.to(model.device)).logits.float().cpu()


def served_reward_model_score(router_address: str, model: str, text: str, timeout_s: float = 600.0) -> float:
    """The scalar of verl's served reward model (``reward.reward_model``: a vLLM ``/classify`` server behind
    verl's reward router) for ``text`` as it is: verl's own reward-model path applies the reward model tokenizer's
    chat template first, which a Pythia or GPT-2 reward model does not have. The request and the score are
    verl's (``RewardLoopWorker.compute_score_disrm``): raw logits, the last one."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"http://{router_address}/classify",
        data=json.dumps({"model": model, "input": text, "use_activation": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return float(json.loads(response.read())["data"][-1]["probs"][-1])


def reward_model_scores(path: str, texts: list[str]) -> list[float]:
    """A reward model's scalar per text (a one-logit sequence-classification head)."""
    logits = classifier_logits(path, texts)
    if logits.shape[-1] != 1:
        raise ValueError(f"reward model {path} has {logits.shape[-1]} labels; a reward model has exactly one")
    return logits[:, 0].tolist()


def positive_probability(path: str, texts: list[str], label: str = "toxic") -> list[float]:
    """P(label | text) of a classifier: softmax over labels (the one named ``label``, else the last one);
    a one-logit head is read as a sigmoid."""
    _, model = load_classifier(path)
    logits = classifier_logits(path, texts)
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[:, 0]).tolist()
    names = {str(v).lower(): int(k) for k, v in (model.config.id2label or {}).items()}
    column = names.get(label.lower(), logits.shape[-1] - 1)
    return torch.softmax(logits, dim=-1)[:, column].tolist()


@torch.no_grad()
def generate_replies(path: str, prompts: list[str], max_new_tokens: int = 32) -> list[str]:
    """Greedy replies of a causal LM to user messages (its chat template if it has one)."""
    tokenizer, model = load_causal_lm(path)
    if tokenizer.chat_template:
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    else:
        texts = list(prompts)
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
