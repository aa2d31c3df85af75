"""Task data and rewards on small fixtures."""

import pandas as pd
import pytest

from tba_ext.tasks.data import write_task
from tba_ext.tasks.rewards import arith_score, compute_score, last_number


def test_arith_reward():
    assert arith_score("12", "12") == 1.0
    assert arith_score(" 12<|im_end|>", "12") == 1.0
    assert arith_score("13", "12") == 0.0
    assert arith_score("12 is it", "12") == 0.0  # the answer must be the number only
    assert arith_score("", "12") == 0.0
    assert compute_score("tba_ext/arith", "7", "7") == 1.0


def test_last_number_rule():
    assert last_number("so 3 apples and 1,200 pears") == "1200"
    assert last_number("no digits") is None


def test_unknown_data_source_is_refused():
    with pytest.raises(ValueError, match="data_source 'nope'"):
        compute_score("nope", "1", "1")


def test_prepare_arith_writes_verl_parquet(tmp_path):
    summary = write_task("arith", str(tmp_path), train_size=20, test_size=5, seed=0)
    frame = pd.read_parquet(summary["train"]["path"])
    assert len(frame) == 20
    row = frame.iloc[0]
    assert row["data_source"] == "tba_ext/arith"
    assert row["prompt"][0]["role"] == "user"
    gt = row["reward_model"]["ground_truth"]
    assert compute_score(row["data_source"], gt, gt) == 1.0
    # the test split asks only operand pairs never seen in training
    test = pd.read_parquet(summary["test"]["path"])
    questions = lambda f: set(f["prompt"].map(lambda p: p[0]["content"]))  # noqa: E731
    assert questions(test).isdisjoint(questions(frame))


def test_unknown_task_and_empty_split_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        write_task("nope", str(tmp_path), 2, 2, 0)
    with pytest.raises(ValueError, match="train-size"):
        write_task("arith", str(tmp_path), 0, 2, 0)
