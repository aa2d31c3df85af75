"""Bad input to the ``tba-ext`` command is refused with the key, file or option named, before any work starts
(in-process: the refusals come from the same ``main`` the console script calls, before Ray or a warm start)."""

from tba_ext.cli import main


def run(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    return code, capsys.readouterr().err


def test_bad_input_is_refused_naming_what_to_fix(tiny_run, tmp_path, capsys):
    code, err = run(capsys, "quickstart", "--out", str(tmp_path / "qs"))  # a mistyped option
    assert code == 2 and "unrecognized arguments: --out" in err and not (tmp_path / "qs").exists()
    cases = [  # (train overrides, text the error must carry)
        ([f"actor_rollout_ref.model.path={tmp_path}/none"], "actor_rollout_ref.model.path"),
        ([f"data.train_files={tmp_path}/none.parquet"], "data.train_files"),
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
        (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name=sglang"),
        (  # tba_sync's dataloader hands over whole batches: 256 prompts cannot serve one of 512
            ["data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=512"],
            "data.train_files: 256 training prompts, fewer than one dataloader fetch of 512",
        ),
    ]
    for overrides, message in cases:
        code, err = run(capsys, "train", "--config", "cpu_tb", f"run_dir={tiny_run}", *overrides)
        assert code == 2 and message in err and "Traceback" not in err, (overrides, err)
    code, err = run(
        capsys,
        "train",
        "--config",
        "cpu_tba",
        f"run_dir={tiny_run}",
        "trainer.v1.sampler.sampler_kwargs.recency_prob=2.0",
    )
    assert code == 2 and "sampler_kwargs.recency_prob" in err
    import pandas as pd

    pd.read_parquet(tiny_run / "data" / "train.parquet").iloc[:0].to_parquet(tmp_path / "empty.parquet")
    code, err = run(
        capsys, "train", "--config", "cpu_tb", f"run_dir={tiny_run}", f"data.train_files={tmp_path}/empty.parquet"
    )
    assert code == 2 and "data.train_files" in err and "has no rows" in err
    code, err = run(capsys, "prepare-data", "--task", "nope", "--out", str(tmp_path / "d"))
    assert code == 2 and "invalid choice: 'nope'" in err and "arith_worked" in err and "Traceback" not in err


def test_an_unknown_command_is_an_argparse_error(capsys):
    code, err = run(capsys, "frobnicate")
    assert code == 2 and "usage: tba-ext" in err and "invalid choice: 'frobnicate'" in err
