"""Bad input, fuzzed (fixed seed): bad configurations across tba.*, algorithm.*, actor_rollout_ref.*, trainer.*,
trainer.v1.*, sampler_kwargs.* and data.* (wrong types, out-of-range values, misspelled keys, contradictory keys)
and malformed data rows each end in one ValueError / TypeError / FileNotFoundError raised in tba_ext whose message
names the key (or the file and row) at fault, from the checks ``tba-ext train`` runs before Ray starts.
``benchmarks/fuzz_inputs.py`` runs the same generator over more cases."""

import contextlib

import pytest
from fuzz_inputs import (
    CONFIGS,
    NAMED,
    Case,
    Checker,
    classify,
    generate,
    run_cases,
    template_counts,
)

SEED = 0
CASES = 270  # >= 200 config cases and 45 data cases, every data template among them


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    return Checker(str(tmp_path_factory.mktemp("fuzz_inputs")))


def report(failures: list[dict]) -> str:
    return "\n".join(
        f"{f['outcome']}: {f['case']} [{f['config']}] -> {f['error']} (raised at {f['raised_at']})" for f in failures
    )


def test_every_bad_input_is_refused_naming_the_key(checker):
    cases = generate(CASES, SEED)
    data = [c for c in cases if c.data]
    assert len(cases) - len(data) >= 200 and len(data) >= template_counts()[1]
    assert len({(c.data["split"], c.data["mutation"]) for c in data}) == template_counts()[1]
    counts, failures = run_cases(checker, cases)
    assert not failures, f"{dict(counts)}\n{report(failures)}"


def test_the_shipped_cpu_configs_pass_the_same_checks(checker):
    """The fuzzer's ground: every case breaks one thing of a config that passes."""
    with checker.fast_compose():
        for config in CONFIGS:
            checker.check(Case("shipped", config, [], []))


@pytest.mark.parametrize(
    "case",
    [
        Case("valid", "cpu_tba", ["trainer.v1.sampler.sampler_kwargs.recency_prob=0.7"], []),
        Case("misspelled", "cpu_tb", ["data.train_batch_sise=4"], ["data.train_batch_sise"]),
        Case("misspelled +", "cpu_drgrpo", ["+data.max_prompt_lenght=4"], ["data.max_prompt_lenght"]),
        Case("bad syntax", "cpu_tb", ["data.train_batch_size=[1,"], ["data.train_batch_size"]),
        Case("wrong type", "cpu_tba_decoupled", ["actor_rollout_ref.rollout.n='4'"], ["actor_rollout_ref.rollout.n"]),
        Case("dangling", "cpu_tb_pg", ["data.max_response_length=${nope}"], ["data.max_response_length"]),
    ],
    ids=lambda c: c.label,
)
def test_the_fast_compose_ends_as_hydra_s_compose(checker, case):
    """The unit lane applies overrides to a cached base with hydra's own override code (``Checker.fast_compose``);
    here the same cases go through hydra's full compose and end the same way."""
    from omegaconf import OmegaConf

    from tba_ext.tools.config import compose

    def run(fast: bool):
        with checker.fast_compose() if fast else contextlib.nullcontext():
            try:
                checker.check(case)
            except Exception as exc:
                return classify(case, exc)["outcome"], str(exc)
            return "accepted", OmegaConf.to_container(compose(case.config, checker.overrides(case)), resolve=True)

    fast, full = run(True), run(False)
    assert fast == full
    assert fast[0] == ("accepted" if not case.names else NAMED)


def test_the_sources_the_preflight_takes_are_those_compute_score_scores():
    from tba_ext.tasks.rewards import SCORED_SOURCES, compute_score

    for source in SCORED_SOURCES:
        try:
            compute_score(source, "1", "1", {"prompt_text": "p"})
        except Exception as exc:
            assert "has no reward for data_source" not in str(exc), source
    with pytest.raises(ValueError, match="has no reward for data_source"):
        compute_score("tba_ext/arithmetic", "1", "1")


def test_a_key_hydra_refuses_is_an_error_line_not_a_traceback(capsys):
    from tba_ext.cli import main

    assert main(["train", "--config", "cpu_tb", "run_dir=/nonexistent", "data.train_batch_sise=4"]) == 2
    err = capsys.readouterr().err
    assert "data.train_batch_sise" in err and "Traceback" not in err
