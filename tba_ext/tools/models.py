"""Offline model factory: a Qwen2-architecture causal LM and a byte-level BPE tokenizer trained on task text.

Byte-level BPE keeps "\n" a single token (the "Ċ" symbol), which verl's Qwen chat handling requires
(verl/utils/tokenizer/continuous_token.py:558). Deterministic from the seed; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch

SIZES = {
    # name: (hidden, layers, heads, kv_heads, intermediate)
    "tiny": (64, 2, 4, 2, 128),  # ~0.1M parameters with a 512 vocabulary: tests
    "small": (192, 4, 6, 2, 512),  # ~2M parameters: the CPU quickstart
    "base": (256, 8, 8, 4, 768),  # ~7M parameters
}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HEADS = {
    "lm": {},
    "reward": {"num_labels": 1},
    "toxicity": {"num_labels": 2, "id2label": {0: "non-toxic", 1: "toxic"}, "label2id": {"non-toxic": 0, "toxic": 1}},
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass
class ModelSpec:
    size: str = "tiny"
    vocab_size: int = 512
    max_positions: int = 512
    seed: int = 0


def train_tokenizer(texts: list[str], vocab_size: int, chat_template: bool = True):
    """Byte-level BPE over ``texts`` wrapped as a transformers fast tokenizer: with a ChatML template and eos
    ``<|im_end|>``, pad ``<|endoftext|>`` (Qwen's kind), or (``chat_template=False``) with neither template nor pad
    token and eos ``<|endoftext|>`` (GPT-2's and Pythia's kind)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    if not chat_template:
        return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=None, eos_token="<|endoftext|>")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(spec: ModelSpec, tokenizer, head: str = "lm"):
    """A Qwen2 causal LM (``head="lm"``), a one-logit reward model (``"reward"``) or a two-label
    non-toxic/toxic classifier (``"toxicity"``); the scorers are for the TL;DR and red-teaming fixtures."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    if head not in HEADS:
        raise ValueError(f"unknown model head {head!r}; choose one of {', '.join(HEADS)}")
    if spec.size not in SIZES:
        raise ValueError(f"unknown model size {spec.size!r}; choose one of {sorted(SIZES)}")
    hidden, layers, heads, kv_heads, inter = SIZES[spec.size]
    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        **HEADS[head],
    )
    if head != "lm":
        return Qwen2ForSequenceClassification(config)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def make_model(out_dir: str, texts: list[str], spec: ModelSpec, head: str = "lm", chat_template: bool = True) -> dict:
    """Train the tokenizer on ``texts``, build the model, save both to ``out_dir``; returns a summary.
    ``chat_template=False``: a tokenizer like GPT-2's / Pythia's (no chat template, no pad token)."""
    tokenizer = train_tokenizer(texts, spec.vocab_size, chat_template)
    model = build_model(spec, tokenizer, head)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    summary = dict(
        asdict(spec),
        head=head,
        chat_template=chat_template,
        parameters=sum(p.numel() for p in model.parameters()),
        vocab=len(tokenizer),
    )
    with open(os.path.join(out_dir, "tba_ext_model.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def check_model_dir(path: str, key: str = "actor_rollout_ref.model.path") -> None:
    """Refuse a missing model dir or a tokenizer that does not fit the model, naming the config key."""
    if not path or not os.path.isdir(path):
        raise FileNotFoundError(f"{key}: model directory not found: {path}")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{key}: {path} has no config.json (not a saved transformers model)")
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ValueError(f"{key}: cannot load a tokenizer from {path}: {exc}") from exc
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"{key}: tokenizer in {path} has {len(tokenizer)} tokens but the model's vocab_size is "
            f"{config.vocab_size}; they do not belong together"
        )
