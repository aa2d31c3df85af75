"""The GPU checks, benchmarks/trainer_passes_gpu.py and benchmarks/gpu_smoke.py, on CPU with a tiny Qwen2 through
verl's actor and reference workers in this process: the scripts a lent GPU runs must work before they get there,
and their checks must catch a fused loss that centres over the wrong groups or makes its group ids off the
micro-batch's device."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import engine_update
import gpu_smoke
import trainer_passes_gpu

TINY = ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--groups", "3", "--group-size", "4",
        "--prompt-len", "5", "--response-len", "12"]  # fmt: skip


def test_the_smoke_check_runs_on_cpu_and_both_updates_match_the_loss_written_out(tmp_path):
    out = tmp_path / "smoke.json"
    result = gpu_smoke.main([*TINY, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["ok"], result["updates"]
    assert set(result["updates"]) == {"tb", "tb_pg"}
    for update in result["updates"].values():
        assert update["loss_rel_diff"] < 1e-5 and update["grad_rel_diff"] < 1e-4, update
        assert update["ref_log_prob_max_abs_diff"] < 1e-5  # the reference forward inside the update
        assert update["metrics"]["tb/kl"] != 0.0  # the actor is not the reference: the KL terms count
    assert {"commit", "device", "torch", "verl", "date"} <= set(result["provenance"])


def test_the_benchmark_runs_on_cpu_and_its_two_paths_agree_at_theta_old(tmp_path):
    out = tmp_path / "gpu.json"
    timing = ["--warmup", "0", "--updates", "1", "--repeats", "2"]
    result = trainer_passes_gpu.main([*TINY, *timing, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    check = result["check_at_old"]
    # verl's three calls with the advantage form, and eq. 5 from one forward: one function at theta = old
    assert check["loss_rel_diff"] < 1e-5 and check["grad_rel_diff"] < 1e-4, check
    assert check["loss_fused"] > 0
    assert result["paths"]["fused"]["forward_units_per_trajectory"] == 3
    assert result["paths"]["three_call"]["forward_units_per_trajectory"] == 5
    for path in result["paths"].values():
        assert path["s_per_update"]["n"] == 2 and path["s_per_update"]["median"] > 0
    assert result["trainer_s_fused_vs_three_call"] > 0


def test_the_benchmark_check_catches_a_fused_loss_centred_over_the_wrong_groups():
    """Group labels of the right sizes that mix two prompts (one micro-batch holds every row, so the loss's guard
    against split groups does not fire): the fused gradient leaves the three-call one."""
    from tba_ext.core.wire import GROUP_FIELD

    groups, k = 2, 4
    with engine_update.built("cpu_tb", "tiny", "cpu", "float32", groups, k, 12, 1e-6) as (workers, config, _):
        batch = engine_update.make_batch(groups, k, 5, 12, engine_update.SIZES["tiny"]["vocab_size"])
        rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # group means 0.75 and 0.25: centring matters
        scores = [
            torch.zeros(len(s)).index_fill(0, torch.tensor([len(s) - 1]), r)
            for s, r in zip(batch["rm_scores"].unbind(), rewards)
        ]
        batch["rm_scores"] = engine_update.nested(scores)
        batch = trainer_passes_gpu.with_stored_reference(workers, batch)
        right = trainer_passes_gpu.check_at_old(workers, batch, config.algorithm, k, micro_groups=groups)
        wrong = batch.copy()
        wrong[GROUP_FIELD] = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
        mixed = trainer_passes_gpu.check_at_old(workers, wrong, config.algorithm, k, micro_groups=groups)
    assert right["grad_rel_diff"] < 1e-4, right
    assert mixed["grad_rel_diff"] > 1e-2, mixed


def test_the_smoke_check_fails_where_the_fused_loss_makes_its_group_ids_off_the_device(tmp_path, monkeypatch):
    """The bug a GPU shows (group ids rebuilt from a host list on the default device, meeting CUDA log-probs),
    seen on the CPU through the meta default device the smoke check runs the loss under."""
    from tba_ext.core import tb

    first_member = tb.first_member

    def on_the_default_device(labels):
        groups, sizes = first_member(labels)
        return torch.tensor(groups.tolist()), torch.tensor(sizes.tolist())

    monkeypatch.setattr(tb, "first_member", on_the_default_device)
    result = gpu_smoke.main([*TINY, "--out", str(tmp_path / "smoke.json")])
    assert not result["ok"]
    for update in result["updates"].values():
        assert not update["ok"] and "meta" in update["error"], update
