"""benchmarks/trainer_passes_gpu.py (issue 26's GPU check) on CPU with a tiny Qwen2: the script a lent GPU runs
must work before it gets there, and its two paths must compute the same update at theta = old."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trainer_passes_gpu


def test_the_gpu_script_runs_on_cpu_and_both_paths_agree_at_theta_old(tmp_path):
    out = tmp_path / "gpu.json"
    result = trainer_passes_gpu.main(
        ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--groups", "3", "--group-size", "4",
         "--prompt-len", "5", "--response-len", "12", "--warmup", "1", "--updates", "2", "--repeats", "2",
         "--out", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    check = result["check_at_old"]
    # the advantage form with a fresh old-log-prob pass and eq. 5 from one forward: one function at theta = old
    assert check["loss_rel_diff"] < 1e-5 and check["grad_rel_diff"] < 1e-4, check
    assert check["loss_fused"] > 0
    assert result["paths"]["fused"]["forward_units_per_trajectory"] == 3
    assert result["paths"]["three_call"]["forward_units_per_trajectory"] == 5
    for path in result["paths"].values():
        assert path["s_per_update"]["n"] == 2 and path["s_per_update"]["median"] > 0
    assert result["trainer_s_fused_vs_three_call"] > 0


def test_the_paths_differ_when_the_groups_are_not_the_loss_groups():
    """The agreement above is not automatic: the three-call advantage centred over the wrong groups (all rows as
    one group) gives another gradient."""
    import torch

    model = trainer_passes_gpu.build_model("tiny", torch.float32, "cpu")
    groups = trainer_passes_gpu.make_groups(2, 4, 5, 12, model.config.vocab_size, "cpu")
    groups[0]["reward"] = torch.tensor([1.0, 0.0, 1.0, 1.0])  # group means 0.75 and 0.25: centring matters
    groups[1]["reward"] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    trainer_passes_gpu.stored_reference(model, groups, 12)
    merged = [{key: torch.cat([g[key] for g in groups]) for key in groups[0]}]
    model.zero_grad()
    trainer_passes_gpu.fused_backward(model, groups, 12, 8)
    grad_groups = trainer_passes_gpu.gradient(model)
    model.zero_grad()
    trainer_passes_gpu.three_call_backward(model, model, merged, 12, 8)
    grad_merged = trainer_passes_gpu.gradient(model)
    assert (grad_groups - grad_merged).norm() / grad_groups.norm() > 1e-3
