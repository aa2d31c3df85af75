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


def test_arith_worked_rows_end_in_their_answer(tmp_path):
    """The generation-bound CPU task: each SFT target is a worked answer whose last number is the sum (so the
    reward grades it 1), a wrong last number grades 0, and the held-out split stays the arith one."""
    summary = write_task("arith_worked", str(tmp_path), train_size=50, test_size=10, seed=0)
    for split in ("train", "test"):
        for row in pd.read_parquet(summary[split]["path"]).itertuples():
            a, b = map(int, row.prompt[0]["content"].split("=?")[0].split("+"))
            answer = row.extra_info["answer_text"]
            assert row.data_source == "tba_ext/arith_worked" and row.reward_model["ground_truth"] == str(a + b)
            assert answer.count("+1=") == b  # one counting step per unit added
            assert compute_score(row.data_source, answer, str(a + b)) == 1.0
            assert compute_score(row.data_source, answer + " or 99", str(a + b)) == 0.0
    arith = write_task("arith", str(tmp_path / "arith"), train_size=50, test_size=10, seed=0)
    questions = lambda p: set(pd.read_parquet(p)["prompt"].map(lambda m: m[0]["content"].split("=?")[0]))  # noqa: E731
    assert questions(summary["test"]["path"]) == questions(arith["test"]["path"])


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


def test_dataset_check_names_the_key_file_and_row(tmp_path):
    from tba_ext.tasks.data import check_dataset, rows_for

    good = rows_for("arith", "train", 3, 0)
    path = str(tmp_path / "train.parquet")

    def write(rows):
        pd.DataFrame(rows).to_parquet(path)

    write(good)
    assert check_dataset(path, "data.train_files") == 3
    write([good[0], dict(good[1], prompt=[]), good[2]])
    with pytest.raises(ValueError, match=r"data.train_files: .*train.parquet row 2: 'prompt' must be"):
        check_dataset(path, "data.train_files")
    write([good[0], good[1], dict(good[2], reward_model={"style": "rule", "ground_truth": None})])
    with pytest.raises(ValueError, match=r"row 3: missing reward_model.ground_truth"):
        check_dataset(path, "data.train_files")
    write([{k: v for k, v in r.items() if k != "data_source"} for r in good])
    with pytest.raises(ValueError, match=r"no 'data_source' column"):
        check_dataset(path, "data.val_files")
    pd.DataFrame(columns=list(good[0])).to_parquet(path)
    with pytest.raises(ValueError, match=r"data.train_files: .* has no rows"):
        check_dataset(path, "data.train_files")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"not a readable parquet"):
        check_dataset(str(tmp_path / "junk.parquet"), "data.train_files")


def test_model_scored_tasks_need_their_models_before_launch(tmp_path):
    from tba_ext.tasks.data import check_dataset, rows_for

    path = str(tmp_path / "train.parquet")
    pd.DataFrame(rows_for("redteam", "train", 2, 0)).to_parquet(path)
    with pytest.raises(ValueError, match=r"reward_kwargs.victim_model_path is required"):
        check_dataset(path, "data.train_files")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"reward_kwargs.toxicity_model_path: no saved"):
        check_dataset(
            path,
            "data.train_files",
            reward_kwargs={"victim_model_path": str(tmp_path / "victim"), "toxicity_model_path": str(tmp_path / "x")},
        )


def test_arith20_holds_out_a_fifth_of_pairs_and_the_test_split_asks_each_once():
    from tba_ext.tasks.arith import held_out_pairs, make_problems

    held_out = held_out_pairs(19)
    assert len(held_out) == 80
    test = make_problems(80, seed=3, split="test", max_operand=19)
    asked = {tuple(int(x) for x in p["question"][:-2].split("+")) for p in test}
    assert asked == held_out
    train = make_problems(2000, seed=3, split="train", max_operand=19)
    assert not {tuple(int(x) for x in p["question"][:-2].split("+")) for p in train} & held_out


def test_evaluate_scores_with_a_users_verl_reward_function(tiny_run, tmp_path, capsys):
    """``tba-ext evaluate --reward-fn PATH:NAME``: the user's function (verl's signature, dict or async returns)
    is what scores; the same rule written by the user gives the built-in task's accuracy. (The CLI's entry point
    in this process: a subprocess per call would add an interpreter start and imports, ~6 s each.)"""
    import json

    from tba_ext.cli import main

    fn = tmp_path / "my_reward.py"
    fn.write_text(
        "from tba_ext.tasks.rewards import compute_score\n"
        "def as_dict(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': compute_score(data_source, solution_str, ground_truth, extra_info), 'acc': 1}\n"
        "async def digits(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(any(c.isdigit() for c in solution_str))\n"
    )
    command = ["evaluate", "--model", str(tiny_run / "model"), "--data", str(tiny_run / "data" / "test.parquet")]
    command += ["--max-new-tokens", "8"]

    def evaluate(*extra):
        capsys.readouterr()
        assert main([*command, *extra]) == 0
        out = capsys.readouterr().out
        return json.loads(out[out.index("{") :])

    built_in = evaluate()
    assert evaluate("--reward-fn", f"{fn}:as_dict")["accuracy"] == built_in["accuracy"]
    digits = evaluate("--reward-fn", f"{fn}:digits")["accuracy"]
    assert digits >= built_in["accuracy"] and digits > 0  # a correct answer has digits; a wrong one may too
    assert main([*command, "--reward-fn", str(fn)]) == 2  # no :NAME
    assert "--reward-fn: expected PATH:NAME" in capsys.readouterr().err


def test_a_tokenizer_without_a_chat_template_gets_the_raw_prompt_or_a_refusal(tiny_run, tmp_path):
    """verl's own RLHFDataset with a tokenizer that has no chat template (GPT-2, Pythia, RhoMath SFT): it keeps
    no row; with tba-ext's raw-text template it keeps every row and the prompt is the message text exactly; the
    start-up check refuses the first case naming the key."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tba_ext.tasks.data import CHAT_TEMPLATE_KEY, RAW_PROMPT_TEMPLATE, check_chat_template
    from tba_ext.tools.config import compose

    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "model")
    tokenizer.chat_template = None
    data = OmegaConf.to_container(compose("cpu_tb", [f"run_dir={tiny_run}"]).data, resolve=True)
    data.update(filter_overlong_prompts=True, filter_overlong_prompts_workers=1)
    train = str(tiny_run / "data" / "train.parquet")
    rows = len(pd.read_parquet(train))
    assert len(RLHFDataset(train, tokenizer, OmegaConf.create(data))) == 0  # verl drops every row, silently
    with pytest.raises(ValueError, match=CHAT_TEMPLATE_KEY.replace(".", r"\.")):
        check_chat_template(tokenizer, data)
    data["apply_chat_template_kwargs"] = {"chat_template": RAW_PROMPT_TEMPLATE}
    check_chat_template(tokenizer, data)
    dataset = RLHFDataset(train, tokenizer, OmegaConf.create(data))
    assert len(dataset) == rows
    messages = dataset[0]["raw_prompt"]
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=RAW_PROMPT_TEMPLATE
    )
    assert rendered == messages[0]["content"]  # the paper's prompt format, no chat tokens


def test_prepare_math_reads_the_release_math500_and_parquet_layouts_and_grades_the_boxed_answer(tmp_path):
    import json

    from tba_ext.tasks.hendrycks_math import INSTRUCTION

    problems = [  # (problem, solution with a boxed answer)
        ("What is $1/2 + 1/4$?", "We add: $\\frac{1}{2}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$."),
        ("Solve $x^2 = 9$ for $x > 0$.", "So $x = \\boxed{3}$."),
    ]
    release = tmp_path / "MATH"
    for split in ("train", "test"):
        for i, (problem, solution) in enumerate(problems):
            folder = release / split / "algebra"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.json").write_text(
                json.dumps({"problem": problem, "level": "Level 1", "type": "Algebra", "solution": solution})
            )
    math500 = tmp_path / "MATH-500"
    math500.mkdir()
    for split in ("train", "test"):
        (math500 / f"{split}.jsonl").write_text(
            "\n".join(
                json.dumps({"problem": p, "solution": s, "answer": a}) for (p, s), a in zip(problems, ["\\frac34", "3"])
            )
        )
    parquet = tmp_path / "lighteval" / "data"
    parquet.mkdir(parents=True)
    for split in ("train", "test"):
        pd.DataFrame([{"problem": p, "solution": s} for p, s in problems]).to_parquet(
            parquet / f"{split}-00000-of-00001.parquet"
        )
    for source in (release, math500, parquet.parent):
        write_task("math", str(tmp_path / "out"), 2, 2, 0, source=str(source))
        rows = pd.read_parquet(tmp_path / "out" / "train.parquet")
        assert len(rows) == 2 and set(rows["data_source"]) == {"tba_ext/math"}
        assert rows["prompt"][0][0]["content"].endswith(INSTRUCTION)
        golds = list(rows["reward_model"].map(lambda r: r["ground_truth"]))
        assert compute_score("tba_ext/math", "It is \\boxed{0.75}.", golds[0]) == 1.0  # 3/4 by math-verify
        assert compute_score("tba_ext/math", "It is \\boxed{0.7}.", golds[0]) == 0.0
        assert compute_score("tba_ext/math", "so \\boxed{3}", golds[1]) == 1.0
    # verl's own MATH data sources are graded the same way
    assert compute_score("HuggingFaceH4/MATH-500", "\\boxed{\\frac{6}{8}}", "\\frac{3}{4}") == 1.0
    # a record without an answer is refused with its file and row
    (math500 / "train.jsonl").write_text(json.dumps({"problem": "p", "solution": "no box here"}))
    with pytest.raises(ValueError, match=r"train\.jsonl row 1: no 'answer' and no \\boxed"):
        write_task("math", str(tmp_path / "bad"), 2, 2, 0, source=str(math500))


def test_prepare_math_writes_every_problem_and_reads_the_test_split_from_a_math500_copy(tmp_path, capsys):
    """MATH's train split from the release and, with --test-source, MATH-500 (HuggingFaceH4/MATH-500's test.jsonl)
    as the test split: every record of each, more than the old 2000 / 200 defaults; --test-size caps."""
    import json

    from tba_ext.cli import main

    release = tmp_path / "MATH"
    for i in range(2003):
        folder = release / "train" / ("algebra" if i % 2 else "geometry")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.json").write_text(
            json.dumps({"problem": f"What is ${i} + 1$?", "solution": f"\\boxed{{{i + 1}}}"})
        )
    math500 = tmp_path / "MATH-500"
    math500.mkdir()
    (math500 / "test.jsonl").write_text(
        "".join(
            json.dumps({"problem": f"What is ${i} - 1$?", "answer": str(i - 1), "level": 3}) + "\n" for i in range(500)
        )
    )
    out = tmp_path / "out"
    args = [
        "prepare-data",
        "--task",
        "math",
        "--source",
        str(release),
        "--test-source",
        str(math500),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["train"]["rows"], summary["test"]["rows"]) == (2003, 500)
    assert (summary["train"]["source"], summary["test"]["source"]) == (str(release), str(math500))
    test = pd.read_parquet(out / "test.parquet")
    assert list(test["reward_model"].map(lambda r: r["ground_truth"]))[:2] == ["-1", "0"]
    assert main(args + ["--test-size", "7"]) == 0
    assert json.loads(capsys.readouterr().out)["test"]["rows"] == 7
    # the release alone has no test split here: the refusal names what to point at
    with pytest.raises(FileNotFoundError, match=r"--source .*MATH-500"):
        write_task("math", str(tmp_path / "no_test"), source=str(release))
    with pytest.raises(ValueError, match="--test-source: task arith is generated"):
        write_task("arith", str(tmp_path / "arith"), test_source=str(math500))
    assert write_task("arith", str(tmp_path / "arith"))["train"]["rows"] == 2000  # generated: the default size


def test_pass_at_k_is_the_chance_a_k_subset_holds_a_right_sample():
    from itertools import combinations

    from tba_ext.tools.evaluate import pass_at_k

    for n, c, k in [(8, 0, 1), (8, 3, 1), (8, 3, 2), (8, 3, 4), (8, 8, 8), (16, 1, 8)]:
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(combinations(outcomes, k))  # every k of the n, drawn without replacement
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError, match="pass@8 needs at least 8 samples"):
        pass_at_k(4, 1, 8)


def test_diversity_counts_pass_at_k_and_distinct_right_answers_per_prompt():
    from tba_ext.tools.evaluate import diversity

    texts = ["12", " 12", "13", "12 ", "7", "8", "9", "10"]  # two prompts of 4 samples
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    out = diversity(texts, rewards, samples=4)
    assert out["pass@1"] == pytest.approx((3 / 4 + 0) / 2) and out["pass@4"] == pytest.approx(0.5)
    assert "pass@8" not in out
    assert out["distinct_correct_per_prompt"] == pytest.approx((1 + 0) / 2)  # "12" in three spellings is one answer


def test_countdown_holds_out_problems_and_grades_any_right_expression_with_reasoning_gym():
    import json

    from tba_ext.tasks import countdown

    test = countdown.make_problems(80, seed=3, split="test")
    train = countdown.make_problems(2000, seed=3, split="train")
    test_keys = {countdown._key(p["numbers"], p["target"]) for p in test}
    assert len(test_keys) == 80  # each held-out problem asked once
    assert not test_keys & {countdown._key(p["numbers"], p["target"]) for p in train}
    assert all(countdown.is_held_out(p["numbers"], p["target"]) for p in test)
    for p in train[:200] + test:  # every SFT target is a right answer, graded by the library's scorer
        truth = countdown.to_verl_row(p, "train", 0)["reward_model"]["ground_truth"]
        assert compute_score("tba_ext/countdown", p["expression"] + "<|im_end|>", truth) == 1.0
    truth = json.dumps({"numbers": [6, 4, 8], "target": 8})
    right = ["4*(8-6)", "(8-6)*4", " 4 * (8 - 6) "]  # several right answers: what distinct-correct counts
    wrong = ["8", "8*4/4", "6+4-2", "4*(8-6)+0", "4*(8-6", "x", ""]
    assert [compute_score("tba_ext/countdown", a, truth) for a in right] == [1.0] * 3
    assert [compute_score("tba_ext/countdown", a, truth) for a in wrong] == [0.0] * len(wrong)
    # right numbers and value, but through an operator countdown does not have: reasoning-gym's scorer alone gives 1
    for answer, numbers, target in [("9+7//2", [9, 7, 2], 12), ("3**2*1", [3, 2, 1], 9)]:
        truth = json.dumps({"numbers": numbers, "target": target})
        assert countdown._scorer().score_answer(answer, {"metadata": json.loads(truth)}) == 1.0
        assert compute_score("tba_ext/countdown", answer, truth) == 0.0


def test_prepare_countdown_writes_verl_parquet_its_rule_reward_scores(tmp_path):
    summary = write_task("countdown", str(tmp_path), train_size=64, test_size=16, seed=1)
    df = pd.read_parquet(summary["test"]["path"])
    assert len(df) == 16 and set(df["data_source"]) == {"tba_ext/countdown"}
    row = df.iloc[0]
    assert row["prompt"][0]["content"].startswith("Make ")
    score = compute_score(row["data_source"], row["extra_info"]["answer_text"], row["reward_model"]["ground_truth"])
    assert score == 1.0
