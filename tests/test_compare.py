"""`tba-ext compare`: the staleness axis per method (composed, no run), the intervals, a stress study's rendering,
and a shortened e2e run of TBA′ and Dr. GRPO on mixed-staleness batches from the same model/data/seed (countdown)."""

import json

import pytest
from omegaconf import OmegaConf

from tba_ext.adapters.checks import check_replay_run, check_tb_run
from tba_ext.tools.compare import compare, interval95
from tba_ext.tools.config import compose
from tba_ext.tools.recipe import METHODS, MIXED, STALENESS_MIX, method_overrides


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("staleness", [0, 4, MIXED])
def test_staleness_bounds_every_source_of_off_policy_data(method, staleness):
    cfg = OmegaConf.to_container(
        compose(METHODS[method].config, ["run_dir=/nonexistent", *method_overrides(method, staleness, 0.95, 32)]),
        resolve=True,
    )
    check_tb_run(cfg)
    v1 = cfg["trainer"]["v1"]
    replay = check_replay_run(cfg)
    # verl's own cap (8 versions, drop and refill) is off for every arm: s alone sets how stale the data are
    assert v1["sampler"]["max_off_policy_threshold"] is None
    if staleness == MIXED:  # every method, Dr. GRPO too, trains from the store's mixed batches, each group once
        assert v1["trainer_mode"].endswith("colocate_async") and replay is not None
        assert replay.staleness_mix == list(STALENESS_MIX) and replay.max_staleness == max(STALENESS_MIX)
        # a batch of fresh groups per update, after an initial buffer of (1 + mean level) batches = 12.75 x 32
        assert replay.min_fresh_groups == 32 and replay.min_buffer_groups == 408
        assert v1["colocate_async"]["num_warmup_batches"] * 32 >= 408
        assert (cfg["algorithm"]["kl_ctrl"]["kl_coef"] == 0.0) == (method == "tb_pg_nokl")
        return
    if staleness == 0:  # on-policy for every method: sync trainer, and fresh groups only
        assert v1["trainer_mode"] in ("sync", "tba_sync")
        assert replay is None or (replay.recency_prob == 1.0 and replay.max_staleness == 0)
    else:
        assert v1["trainer_mode"].endswith("colocate_async")
        assert v1["colocate_async"]["num_warmup_batches"] == staleness
        assert replay is None or (replay.recency_prob == 0.95 and replay.max_staleness == staleness)
    assert (replay is not None) == METHODS[method].replay
    assert (cfg["algorithm"]["kl_ctrl"]["kl_coef"] == 0.0) == (method == "tb_pg_nokl")  # the stress arm's one change


def test_the_corrected_baselines_are_verls_rollout_corrections_truncated_at_tbas_clamp():
    """What a verl user runs on stale data: Dr. GRPO's loss weighted by verl's truncated pi_old / pi_rollout (per
    token, per sequence) or verl's bypass mode (the PPO clip against the behaviour policy); and TBA′ on verl's own
    batches (no store), which differs from the token-IS arm in the advantage alone."""
    from tba_ext.core.settings import IS_RATIO_MAX

    def composed(method):
        overrides = ["run_dir=/nonexistent", *method_overrides(method, 8, 0.95, 32)]
        return OmegaConf.to_container(compose(METHODS[method].config, overrides), resolve=True)

    expected = {"drgrpo": (None, False), "drgrpo_tis": ("token", False), "drgrpo_sis": ("sequence", False)}
    expected["drgrpo_bypass"] = (None, True)
    for method, (rollout_is, bypass) in expected.items():
        cfg = composed(method)
        correction = cfg["algorithm"]["rollout_correction"]
        assert (correction["rollout_is"], correction["bypass_mode"]) == (rollout_is, bypass), method
        if rollout_is:
            assert float(correction["rollout_is_threshold"]) == IS_RATIO_MAX
        assert cfg["algorithm"]["adv_estimator"] == "grpo" and cfg["trainer"]["v1"]["trainer_mode"] == "colocate_async"
        assert cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "vanilla"
        assert cfg["actor_rollout_ref"]["rollout"]["calculate_log_probs"]  # verl's weights need pi_rollout
    fifo, tb_pg = composed("tb_pg_fifo"), composed("tb_pg")
    assert check_replay_run(fifo) is None and check_replay_run(tb_pg) is not None
    assert fifo["trainer"]["v1"]["trainer_mode"] == tb_pg["trainer"]["v1"]["trainer_mode"] == "tba_colocate_async"
    assert fifo["algorithm"] == tb_pg["algorithm"] and fifo["actor_rollout_ref"] == tb_pg["actor_rollout_ref"]


def test_arms_at_unequal_trained_on_staleness_are_not_paired_and_the_table_says_why():
    from tba_ext.tools.compare import analyse, compare_tables, trained_staleness

    records = [{"step": t, "data": {"training/off_policy/trajectory_staleness/mean": float(t)}} for t in range(1, 11)]
    records[4]["data"] |= {"training/off_policy/trajectory_staleness/max": 7.0, "a/off_policy/evicted_samples": 3}
    records[6]["data"] |= {"training/off_policy/trajectory_staleness/max": 9.0, "a/off_policy/evicted_samples": 2}
    stats = trained_staleness(records)
    assert stats == {"mean": 5.5, "median": 5.5, "p90": pytest.approx(9.1), "max": 9.0, "dropped_groups": 5}

    def run(method, seed, gain, staleness):
        return {
            "method": method,
            "staleness": 8,
            "seed": seed,
            "accuracy_before": 0.2,
            "accuracy_after": 0.2 + gain,
            "sampled_before": 0.2,
            "sampled_after": 0.2,
            "wall_s": 1.0,
            "mean_staleness": staleness,
        }

    # TBA′ at 5.0 against Dr. GRPO token-IS at 4.6 (8 % apart) is paired; against Dr. GRPO at 2.0 it is not
    runs = [run("tb_pg", seed, 0.1 + 0.05 * seed, 5.0) for seed in range(3)]
    runs += [run("drgrpo_tis", seed, 0.02 * seed, 4.6) for seed in range(3)]
    runs += [run("drgrpo", seed, -0.1, 2.0) for seed in range(3)]
    doc = analyse({"runs": runs, "labels": {}})
    assert doc["paired_vs_drgrpo_tis"]["tb_pg"]["8"]["mean"] == pytest.approx(0.1 + 0.03)
    refused = doc["paired_vs_drgrpo"]["tb_pg"]["8"]
    assert "mean" not in refused and "5.0 updates old on average and Dr. GRPO on 2.0" in refused["refused"]
    page = compare_tables(doc)
    assert "| TBA′ - Dr. GRPO | 8 | 3 | not paired: TBA′ trained on data 5.0" in page
    assert "| TBA′ - Dr. GRPO token-IS | 8 | 3 | +0.130 +- 0.030 |" in page


def test_every_paired_row_carries_its_t_test_p_value_and_holms_adjustment_over_the_study():
    from scipy import stats

    from tba_ext.tools.compare import analyse

    gains = {"tb_pg": [0.30, 0.25, 0.40, 0.35], "tb": [0.05, 0.20, -0.02, 0.10], "drgrpo": [0.0, 0.02, 0.01, 0.03]}
    runs = [
        {"method": m, "staleness": 4, "seed": seed, "accuracy_before": 0.2, "accuracy_after": 0.2 + g}
        | {"sampled_before": 0.2, "sampled_after": 0.2, "wall_s": 1.0}
        for m, by_seed in gains.items()
        for seed, g in enumerate(by_seed)
    ]
    paired = analyse({"runs": runs, "labels": {}})["paired_vs_drgrpo"]
    p = {m: stats.ttest_rel(gains[m], gains["drgrpo"]).pvalue for m in ("tb_pg", "tb")}
    for m in p:
        assert paired[m]["4"]["p_value"] == pytest.approx(p[m])
    low, high = sorted(p, key=p.get)  # Holm: the smallest times 2, the next times 1, kept monotone and <= 1
    assert paired[low]["4"]["p_holm"] == pytest.approx(min(1.0, 2 * p[low]))
    assert paired[high]["4"]["p_holm"] == pytest.approx(min(1.0, max(2 * p[low], p[high])))


def test_interval95_is_the_t_interval():
    mean, sd, half = interval95([1.0, 2.0, 3.0])
    assert (mean, sd) == (2.0, 1.0)
    assert half == pytest.approx(4.302652729911275 / 3**0.5)  # t(0.975, 2 dof) * sd / sqrt(n)
    assert interval95([0.5]) == (0.5, 0.0, 0.0)


@pytest.mark.e2e
def test_compare_short_runs_two_methods_on_mixed_staleness_batches_from_one_start_and_summarises(tmp_path):
    """TBA′ (tba-ext's trainer) and Dr. GRPO with verl's token-level rollout IS (verl's own colocate_async trainer)
    both drawing mixed-staleness batches from tba-ext's store, on the second task (countdown): the reasoning-gym
    scorer inside verl's reward loop and the diversity of its several right answers. (s > 0 for TB and TBA′ through
    replay: tests/test_e2e.py and the quickstart's test.)"""
    results = tmp_path / "compare.json"
    methods = ["tb_pg", "drgrpo_tis"]
    compare(
        str(tmp_path / "cmp"),
        short=True,
        seeds=[0],
        staleness=[MIXED],
        methods=methods,
        results_path=str(results),
        task="countdown",
    )
    saved = json.loads(results.read_text())
    assert saved["recipe"]["task"] == "countdown"
    runs = saved["runs"]
    assert {r["method"] for r in runs} == set(methods)
    assert len({(r["accuracy_before"], r["sampled_before"]) for r in runs}) == 1  # identical start for all
    assert all(r["mean_staleness"] is not None and r["mean_staleness"] > 0 for r in runs)
    for r in runs:  # pass@k of the 16 samples per prompt: rises with k, and pass@1 is the sampled accuracy
        d = r["diversity_after"]
        assert d["pass@1"] <= d["pass@2"] <= d["pass@4"] <= d["pass@8"]
        assert d["pass@1"] == pytest.approx(r["sampled_after"])
    for r in runs:
        summary = saved["summary"][r["method"]][MIXED]
        assert summary["n_seeds"] == 1
        assert summary["gain_mean"] == pytest.approx(r["accuracy_after"] - r["accuracy_before"])
    for method in methods:  # no replay, and the last update's batch mixes staleness (the top level ramps up)
        last = [json.loads(line)["data"] for line in open(tmp_path / "cmp" / "seed0" / f"{method}_s{MIXED}.jsonl")][-1]
        assert last["replay/fraction"] == 0.0 and last["replay/staleness_max"] > last["replay/staleness_min"]
        assert last["replay/staleness_mean"] >= 1.0
        if method == "drgrpo_tis":  # verl's weights pi_old / pi_rollout from the stored searcher log-probs
            assert 0 < last["rollout_corr/rollout_is_mean"] and last["rollout_corr/rollout_is_max"] <= 8.0
    for r in runs:  # every arm drew from the same store: equally stale batches, nothing dropped by verl's cap
        assert r["trained_staleness"]["dropped_groups"] == 0
        assert r["trained_staleness"]["mean"] == pytest.approx(runs[0]["trained_staleness"]["mean"], rel=0.1)
    run = tmp_path / "cmp"
    assert "Dr. GRPO" in (run / "report.md").read_text()
    assert (run / "accuracy_vs_updates.png").stat().st_size > 10_000
    assert (run / "accuracy_vs_time.png").stat().st_size > 10_000


def _part(seed: int, gain: float) -> dict:
    run = {
        "method": "tb",
        "staleness": 0,
        "seed": seed,
        "accuracy_before": 0.2,
        "accuracy_after": 0.2 + gain,
        "sampled_before": 0.3,
        "sampled_after": 0.3 + gain / 2,
        "wall_s": 100.0,
    }
    curve = {"steps": [0, 10], "accuracy": [0.2, 0.2 + gain], "time": [0.0, 50.0]}
    return {
        "recipe": {"task": "arith20"},
        "steps": 10,
        "seeds": [seed],
        "staleness": [0],
        "methods": ["tb"],
        "runs": [run],
        "curves": {"tb s=0": [curve]},
    }


def test_summary_reports_the_share_of_the_on_policy_gain_kept_off_policy():
    from tba_ext.tools.compare import summarise

    def run(method, s, seed, gain):
        return {
            "method": method,
            "staleness": s,
            "seed": seed,
            "accuracy_before": 0.3,
            "accuracy_after": 0.3 + gain,
            "sampled_before": 0.3,
            "sampled_after": 0.3 + gain,
            "wall_s": 1.0,
        }

    summary = summarise(
        [
            run("tb", 0, 0, 0.10),
            run("tb", 0, 1, 0.30),
            run("tb", 10, 0, 0.05),
            run("tb", 10, 1, 0.13),
            run("drgrpo", 0, 0, -0.1),
            run("drgrpo", 10, 0, 0.1),
            run("tb_pg", 10, 0, 0.1),
        ]
    )
    assert summary["tb"]["10"]["gain_kept"] == pytest.approx(0.09 / 0.20)
    assert summary["tb"]["0"]["sampled_gain_kept"] == pytest.approx(1.0)
    assert summary["drgrpo"]["10"]["gain_kept"] is None  # no on-policy gain to keep
    assert summary["tb_pg"]["10"]["gain_kept"] is None  # no on-policy run


def test_paired_difference_is_the_paired_t_interval_over_seeds_with_both_runs():
    from scipy import stats

    from tba_ext.tools.compare import paired_differences

    def run(method, seed, before, after):
        return {"method": method, "staleness": 10, "seed": seed, "accuracy_before": before, "accuracy_after": after}

    runs = [run("drgrpo", 0, 0.2, 0.1), run("tb_pg", 0, 0.2, 0.4), run("drgrpo", 1, 0.4, 0.45)]
    runs += [run("tb_pg", 1, 0.4, 0.6), run("drgrpo", 2, 0.3, 0.3), run("tb_pg", 2, 0.3, 0.35)]
    runs.append(run("tb_pg", 3, 0.3, 0.9))  # no Dr. GRPO run of seed 3: not paired
    cell = paired_differences(runs)["tb_pg"]["10"]
    diffs = [0.4 - 0.1, 0.6 - 0.45, 0.35 - 0.3]
    test = stats.ttest_rel([0.4, 0.6, 0.35], [0.1, 0.45, 0.3])  # scipy's paired t-test as the independent check
    low, high = test.confidence_interval(0.95)
    assert cell["n_seeds"] == 3 and cell["mean"] == pytest.approx(sum(diffs) / 3)
    assert cell["mean"] - cell["ci95"] == pytest.approx(low) and cell["mean"] + cell["ci95"] == pytest.approx(high)
    assert cell["excludes_zero"] == (low > 0 or high < 0)
    assert "drgrpo" not in paired_differences(runs)


def test_staleness_cost_pairs_each_method_with_its_own_on_policy_run_and_with_dr_grpos_cost():
    from scipy import stats

    from tba_ext.tools.compare import compare_tables, staleness_cost

    def run(method, s, seed, gain):
        return {"method": method, "staleness": s, "seed": seed, "accuracy_before": 0.2, "accuracy_after": 0.2 + gain}

    gains = {  # (method, s): gain per seed 0, 1, 2
        ("tb_pg", 0): [0.10, 0.20, 0.15],
        ("tb_pg", 10): [0.12, 0.10, 0.16],
        ("drgrpo", 0): [0.12, 0.18, 0.10],
        ("drgrpo", 10): [-0.10, -0.05, -0.12],
    }
    runs = [run(m, s, seed, g) for (m, s), by_seed in gains.items() for seed, g in enumerate(by_seed)]
    runs.append(run("tb_pg", 10, 3, 0.5))  # no on-policy run of seed 3: no cost to pair
    cost = staleness_cost(runs)
    assert list(cost) == ["tb_pg", "drgrpo", "tb_pg - drgrpo"] and "0" not in cost["tb_pg"]  # own costs first
    # scipy's paired t-test as the independent check: gain at s = 10 against the same seed's on-policy gain
    for method in ("tb_pg", "drgrpo"):
        cell = cost[method]["10"]
        low, high = stats.ttest_rel(gains[(method, 10)], gains[(method, 0)]).confidence_interval(0.95)
        assert cell["n_seeds"] == 3
        assert cell["mean"] - cell["ci95"] == pytest.approx(low) and cell["mean"] + cell["ci95"] == pytest.approx(high)
    tb_pg_cost = [a - b for a, b in zip(gains[("tb_pg", 10)], gains[("tb_pg", 0)])]
    drgrpo_cost = [a - b for a, b in zip(gains[("drgrpo", 10)], gains[("drgrpo", 0)])]
    low, high = stats.ttest_rel(tb_pg_cost, drgrpo_cost).confidence_interval(0.95)
    cell = cost["tb_pg - drgrpo"]["10"]
    assert cell["mean"] - cell["ci95"] == pytest.approx(low) and cell["mean"] + cell["ci95"] == pytest.approx(high)
    assert cell["excludes_zero"] == (low > 0)
    assert staleness_cost([r for r in runs if r["staleness"] == 10]) == {}  # no on-policy runs: nothing to pair
    page = compare_tables({"summary": {}, "runs": runs, "staleness_cost": cost, "labels": {}})
    assert "| TBA′ at s - at s = 0 | 10 | 3 |" in page and "| TBA′'s cost - Dr. GRPO's | 10 | 3 |" in page


def test_merge_joins_grids_run_in_parallel_and_refuses_different_recipes(tmp_path):
    from tba_ext.tools.compare import merge

    paths = []
    for seed, gain in [(0, 0.1), (1, 0.3)]:
        paths.append(tmp_path / f"part{seed}.json")
        paths[-1].write_text(json.dumps(_part(seed, gain)))
    out = tmp_path / "grid.json"
    merged = merge([str(p) for p in paths], str(tmp_path / "grid"), str(out))
    tb = json.loads(out.read_text())["summary"]["tb"]["0"]
    assert merged["seeds"] == [0, 1] and tb["n_seeds"] == 2
    assert tb["gain_mean"] == pytest.approx(0.2) and tb["gain_sd"] == pytest.approx(0.2 / 2**0.5)  # sd of 0.1, 0.3
    assert tb["sampled_gain_mean"] == pytest.approx(0.1)
    assert tb["gain_kept"] == pytest.approx(1.0)
    assert (tmp_path / "grid" / "accuracy_vs_updates.png").stat().st_size > 10_000
    # a later part adding Dr. GRPO to seed 0 (listed first) joins the grid, its method named in METHODS' order
    later = _part(0, -0.1)
    later["methods"], later["runs"][0]["method"] = ["drgrpo"], "drgrpo"
    later["curves"] = {"drgrpo s=0": later["curves"].pop("tb s=0")}
    (tmp_path / "later.json").write_text(json.dumps(later))
    joined = merge([str(tmp_path / "later.json"), *map(str, paths)], str(tmp_path / "joined"))
    assert joined["methods"] == ["tb", "drgrpo"] and joined["labels"] == {"tb": "TB", "drgrpo": "Dr. GRPO"}
    assert list(joined["summary"]) == ["tb", "drgrpo"]
    assert joined["paired_vs_drgrpo"]["tb"]["0"]["mean"] == pytest.approx(0.1 - -0.1)
    assert set(joined["curves"]) == {"tb s=0", "drgrpo s=0"}
    with pytest.raises(ValueError, match="TB at s = 0, seed 0 is in more than one"):
        merge([str(out), str(paths[0])], str(tmp_path / "twice"))  # the grid again with one of its parts
    other = _part(2, 0.0)
    other["steps"] = 20
    paths[1].write_text(json.dumps(other))
    with pytest.raises(ValueError, match="different steps"):
        merge([str(p) for p in paths], str(tmp_path / "grid2"))


def test_a_stress_study_at_one_staleness_pairs_against_both_baselines_and_renders(tmp_path):
    """s = 32 only (no on-policy cell to keep a share of), TBA′ with and without KL and Dr. GRPO: the JSON pairs
    against Dr. GRPO and against TBA′ beta = 0, the plot is one panel, and the docs renderer takes it."""
    from tba_ext.tools.compare import compare_tables, merge

    gains = {"tb_pg": [0.10, 0.20], "tb_pg_nokl": [-0.10, 0.05], "drgrpo": [-0.20, -0.10]}
    part = _part(0, 0.0)
    part.update(staleness=[32], methods=list(gains), seeds=[0, 1], runs=[], curves={})
    for method, by_seed in gains.items():
        for seed, gain in enumerate(by_seed):
            diversity = {"pass@1": 0.1 + gain / 4, "pass@8": 0.5, "distinct_correct_per_prompt": 1.0}
            run = _part(seed, gain)["runs"][0] | {"method": method, "staleness": 32, "seed": seed}
            run |= {"diversity_before": {k: 0.2 for k in diversity}, "diversity_after": diversity}
            part["runs"].append(run)
            part["curves"].setdefault(f"{method} s=32", []).append(_part(seed, gain)["curves"]["tb s=0"][0])
    (tmp_path / "part.json").write_text(json.dumps(part))
    doc = merge([str(tmp_path / "part.json")], str(tmp_path / "stress"), str(tmp_path / "stress.json"))
    kl = doc["paired_vs_tb_pg_nokl"]["tb_pg"]["32"]
    assert kl["mean"] == pytest.approx(((0.10 + 0.10) + (0.20 - 0.05)) / 2) and kl["n_seeds"] == 2
    assert doc["paired_vs_drgrpo"]["tb_pg_nokl"]["32"]["mean"] == pytest.approx((0.10 + 0.15) / 2)
    assert doc["summary"]["tb_pg"]["32"]["gain_kept"] is None  # no s = 0 cell
    assert (tmp_path / "stress" / "accuracy_vs_updates.png").stat().st_size > 10_000
    page = compare_tables(json.loads((tmp_path / "stress.json").read_text()))
    assert page in (tmp_path / "stress" / "report.md").read_text()  # the report and the docs: one renderer
    assert "| TBA′ - TBA′ β=0 | 32 | 2 |" in page and "| TBA′ β=0 - Dr. GRPO | 32 | 2 |" in page
    assert "| warm start | | 0.200 | 0.200 | 0.200 |" in page
    assert f"| TBA′ | 32 | {0.1 + 0.15 / 4:.3f} | 0.500 | 1.000 |" in page  # pass@1 after: mean over the two seeds

    # the mixed-staleness arm, run in its own process, joins the study as its last level, paired within it
    mixed = {**part, "staleness": [MIXED], "runs": [], "curves": {}}
    for run in part["runs"]:
        mixed["runs"].append(run | {"staleness": MIXED, "accuracy_after": run["accuracy_after"] + 0.01})
        mixed["curves"].setdefault(f"{run['method']} s={MIXED}", []).append(
            _part(run["seed"], 0.1)["curves"]["tb s=0"][0]
        )
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    doc = merge([str(tmp_path / "mixed.json"), str(tmp_path / "part.json")], str(tmp_path / "both"))
    assert doc["staleness"] == [32, MIXED]
    assert doc["paired_vs_tb_pg_nokl"]["tb_pg"][MIXED]["mean"] == pytest.approx(kl["mean"])
    page = compare_tables(doc)
    assert page.index("| TBA′ | 32 |") < page.index(f"| TBA′ | {MIXED} |")
    assert (tmp_path / "both" / "accuracy_vs_updates.png").stat().st_size > 10_000


def test_provenance_names_the_commit_of_the_tba_ext_that_ran_not_of_the_current_folder(tmp_path, monkeypatch):
    """A study run from another checkout (a worktree on PYTHONPATH) records that checkout's commit."""
    import subprocess
    from pathlib import Path

    import tba_ext

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from common import provenance

    checkout = Path(tba_ext.__file__).resolve().parents[1]
    expected = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    monkeypatch.chdir(tmp_path)  # not a git folder
    made = provenance()
    assert made["commit"] == expected.stdout.strip() != ""
    import torch  # the vector unit a float32 result depends on (ATEN_CPU_CAPABILITY), recorded with it

    assert made["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and made["torch_threads"] >= 1


def test_every_evidence_study_is_a_compare_grid_the_docs_render(monkeypatch):
    """benchmarks/evidence.py's studies name known tasks, methods and staleness levels, and each has its section in
    docs/generate.py (which refuses a results JSON it has no renderer for)."""
    from pathlib import Path

    from tba_ext.tools.recipe import TASK_RECIPES, staleness_level

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    monkeypatch.syspath_prepend(str(root / "docs"))
    import evidence
    import generate

    for study, spec in evidence.STUDIES.items():
        assert spec["task"] in TASK_RECIPES, study
        assert set(spec["methods"]) <= set(METHODS), study
        assert [staleness_level(s) for s in spec["staleness"]] == spec["staleness"], study
        assert spec.get("seeds", evidence.SEEDS), study
        assert f"compare_{study}" in generate.RENDERERS, study
        assert f"compare_{study}" in generate.blocks(), study
