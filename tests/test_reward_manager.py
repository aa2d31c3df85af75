"""The ``tba_checked`` reward manager on one real verl DataProto row: a reward function that raises, returns a
non-number or NaN is stopped with a message naming the function, the data source and the row. The same manager
inside a real verl run (how its error reaches the user and the checkpoints survive) is tests/test_e2e.py's."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto

from tba_ext.adapters.reward_manager import CheckedRewardManager, RewardFunctionError
from tba_ext.tasks.data import corpus_for
from tba_ext.tools.config import compose
from tba_ext.tools.models import train_tokenizer

PATH = "/users/me/my_reward.py"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus_for("arith", 0)[:200], vocab_size=300)


def one_row(tokenizer, text="12"):
    ids = tokenizer(text)["input_ids"]
    responses = torch.tensor([ids + [tokenizer.pad_token_id] * 2])
    prompts = torch.tensor([[1, 2, 3]])
    mask = torch.cat([torch.ones(1, 3 + len(ids)), torch.zeros(1, 2)], dim=1).long()
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array(["tba_ext/arith"], dtype=object),
            "reward_model": np.array([{"ground_truth": "12"}], dtype=object),
            "extra_info": np.array([{"split": "train", "index": 41}], dtype=object),
        },
    )


def score_with(config_name, tokenizer, fn):
    config = compose(config_name, ["run_dir=/nonexistent", f"reward.custom_reward_function.path={PATH}"])
    manager = CheckedRewardManager(OmegaConf.create(OmegaConf.to_container(config, resolve=True)), tokenizer, fn)
    return manager.loop.run_until_complete(manager.run_single(one_row(tokenizer)))  # the loop it was made with


def boom(**kwargs):
    raise ZeroDivisionError("boom")


BAD = {  # what the function does, the text the error must carry
    "raises": (boom, "raised ZeroDivisionError: boom"),
    "string": (lambda **kw: "correct", "returned str 'correct'"),
    "bool": (lambda **kw: True, "returned bool True"),
    "nan": (lambda **kw: float("nan"), "returned nan"),
}


@pytest.mark.parametrize("mode", sorted(BAD))
def test_a_bad_reward_is_refused_naming_the_function_data_source_and_row(tokenizer, mode):
    fn, message = BAD[mode]
    with pytest.raises(RewardFunctionError) as err:
        score_with("cpu_tb", tokenizer, fn)
    assert message in str(err.value)
    assert (
        f"reward function {PATH}:compute_score (reward.custom_reward_function) on data_source='tba_ext/arith', "
        "train row with extra_info.index=41"
    ) in str(err.value)


def test_a_good_reward_passes_and_nan_is_left_to_the_replay_store(tokenizer):
    seen = {}

    def exact(data_source, solution_str, ground_truth, extra_info=None, **kw):
        seen.update(solution=solution_str, truth=ground_truth)
        return {"score": float(solution_str == ground_truth), "acc": 1}

    assert score_with("cpu_tb", tokenizer, exact)["reward_score"] == 1.0
    assert seen == {"solution": "12", "truth": "12"}  # the valid response tokens only, decoded
    # the replay sampler counts and skips non-finite rewards (stopping past max_nonfinite_frac): passed through
    assert math.isnan(score_with("cpu_tba", tokenizer, lambda **kw: float("nan"))["reward_score"])
