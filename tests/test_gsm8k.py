"""GSM8K from a user-supplied copy (small fixtures written here) and GSM-symbolic from reasoning-gym."""

import json

import pandas as pd
import pytest

from tba_ext.tasks.data import write_task
from tba_ext.tasks.gsm8k import gsm8k_score, load_rows, symbolic_rows
from tba_ext.tasks.rewards import compute_score

FIXTURE = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A box holds 1,200 pens; 200 are sold. How many remain?", "answer": "1,000 left\n#### 1,000"},
]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_load_official_jsonl_layout(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", FIXTURE)
    write_jsonl(tmp_path / "test.jsonl", FIXTURE[:1])
    rows = load_rows(str(tmp_path), "train")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1000"]
    assert rows[0]["prompt"][0]["content"].startswith("[MATH TASK] Problem:\nTom has")
    summary = write_task("gsm8k", str(tmp_path / "out"), 10, 10, 0, source=str(tmp_path))
    assert summary["train"]["rows"] == 2 and summary["test"]["rows"] == 1


def test_prepare_data_writes_every_row_of_the_copy_unless_capped(tmp_path, capsys):
    """The whole of each split by default (openai/gsm8k: 7473 / 1319), more rows than the old 2000 / 200 defaults;
    --train-size / --test-size cap a split at its first rows."""
    from tba_ext.cli import main

    def rows(n):
        return [dict(FIXTURE[0], question=f"Tom has {i} apples and buys 4 more. How many?") for i in range(n)]

    write_jsonl(tmp_path / "train.jsonl", rows(2003))
    write_jsonl(tmp_path / "test.jsonl", rows(203))
    assert main(["prepare-data", "--task", "gsm8k", "--source", str(tmp_path), "--out", str(tmp_path / "all")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["train"]["rows"], summary["test"]["rows"]) == (2003, 203)
    assert summary["train"]["source"] == summary["test"]["source"] == str(tmp_path)
    assert list(pd.read_parquet(tmp_path / "all" / "test.parquet")["extra_info"].map(lambda e: e["index"])) == list(
        range(203)
    )
    capped = write_task("gsm8k", str(tmp_path / "capped"), 5, 3, source=str(tmp_path))
    assert (capped["train"]["rows"], capped["test"]["rows"]) == (5, 3)
    with pytest.raises(ValueError, match="--test-size must be > 0"):
        write_task("gsm8k", str(tmp_path / "bad"), None, 0, source=str(tmp_path))


def test_parquet_layout(tmp_path):
    (tmp_path / "main").mkdir()
    pd.DataFrame(FIXTURE).to_parquet(tmp_path / "main" / "test-00000-of-00001.parquet")
    assert len(load_rows(str(tmp_path), "test")) == 2


def test_malformed_row_names_file_and_row(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [FIXTURE[0], {"question": "no answer here"}])
    with pytest.raises(ValueError, match=r"train.jsonl row 2: missing"):
        load_rows(str(tmp_path), "train")
    write_jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"row 1: answer has no '####"):
        load_rows(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="--source"):
        load_rows(str(tmp_path / "missing"), "train")


@pytest.mark.parametrize("rule", ["math_verify", "last_number"])
def test_gsm8k_grading(rule):
    assert gsm8k_score("so the answer is 1000", "1000", rule) == 1.0
    assert gsm8k_score("so the answer is 999", "1000", rule) == 0.0
    assert compute_score("tba_ext/gsm8k", "#### 7", "7", {"grading": rule}) == 1.0


def test_math_verify_accepts_equivalent_forms():
    assert gsm8k_score("The answer is $\\frac{1}{2}$", "0.5") == 1.0


def test_gsm_symbolic_offline():
    rows = symbolic_rows("train", 5, seed=0)
    test = symbolic_rows("test", 5, seed=0)
    assert len(rows) == 5 and rows[0]["data_source"] == "tba_ext/gsm_symbolic"
    assert {r["prompt"][0]["content"] for r in rows}.isdisjoint({r["prompt"][0]["content"] for r in test})
    cot = rows[0]["extra_info"]["answer_text"]
    assert compute_score("tba_ext/gsm_symbolic", cot, rows[0]["reward_model"]["ground_truth"]) == 1.0


def test_math_verify_grading_works_in_verls_reward_threads():
    """verl's reward loop calls the reward function from worker threads; math-verify's default time limit
    (signal.alarm) raises there on every row."""
    import threading

    from tba_ext.tasks.gsm8k import gsm8k_score
    from tba_ext.tasks.hendrycks_math import math_score

    out = {}

    def score():
        out["gsm8k"] = gsm8k_score("so 3 + 4 = 7\n#### 7", "7", rule="math_verify")
        out["math"] = math_score("the answer is $\\boxed{\\frac{1}{2}}$", "0.5")

    thread = threading.Thread(target=score)
    thread.start()
    thread.join()
    assert out == {"gsm8k": 1.0, "math": 1.0}
