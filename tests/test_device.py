"""The update path with its tensors off the CPU, on a machine without an accelerator.

On a GPU verl's engine moves each micro-batch to the device before the loss (``micro_batch.to(get_device_id())``).
Two stand-ins reach that path here:
- torch's default-device context: inputs on the CPU, every tensor made without an explicit device (``torch.tensor``,
  ``torch.arange``, ``torch.zeros``) lands on the meta device, so a factory that does not follow its inputs mixes
  devices and fails, as a CPU-built tensor meets CUDA log-probs on a GPU;
- the meta device itself: the loss's tensor part runs with no data, so any read back to the host (``.item()``,
  ``.tolist()``, ``bool()``) fails, where on a GPU it would synchronise the stream.
"""

import torch
import verl  # noqa: F401  (loads the tba_ext plugin through its entry point)
from test_fused import ActorConfig, engine_inputs, group_batch
from test_rows import agent_loop_row
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tba_ext.adapters import fused
from tba_ext.adapters.reference import replace_rows
from tba_ext.adapters.rows import build_row, load_prompt, split_row
from tba_ext.core import tb, wire


def micro_batch(mode, seed=5):
    batch = group_batch(3, 4, 6, seed=seed)
    old, ref, rollout, mask, reward, groups = batch
    theta = old.clone().requires_grad_()
    out, data = engine_inputs(theta, ref, rollout, mask, reward, groups, 0.05, mode, list(range(12)), 12)
    return theta, out, data


def test_the_fused_loss_makes_every_tensor_on_its_inputs_device():
    """Fails where a tensor is built on the default device (the group ids of the code before: torch.tensor over a
    list, then index_add_ against the log-probs)."""
    for mode in ("tb", "tb_pg"):
        theta, out, data = micro_batch(mode)
        expected, _ = fused.fused_tb_loss(ActorConfig(), out, data)
        theta, out, data = micro_batch(mode)
        with torch.device("meta"):
            loss, metrics = fused.fused_tb_loss(ActorConfig(), out, data)
        assert loss.device.type == "cpu" and torch.equal(loss, expected), mode
        (grad,) = torch.autograd.grad(loss, theta)
        assert grad.device.type == "cpu" and grad.abs().sum() > 0
        assert all(len(metric.values) == 1 for metric in metrics.values())


def padded_on_meta(mode):
    batch = group_batch(3, 4, 6, seed=2)
    old, ref, rollout, mask, reward, groups = batch
    scores = torch.zeros_like(mask)
    scores[torch.arange(len(reward)), mask.sum(-1).long() - 1] = reward
    padded = {
        "response_mask": mask.long(),
        "rm_scores": scores,
        "ref_log_prob": ref,
        "rollout_log_probs": rollout,
        wire.GROUP_FIELD: groups * 7 + 3,  # the trainer's ids over the whole batch, not dense per micro-batch
    }
    config = ActorConfig()
    config.global_batch_info.update(dp_size=1, global_batch_size=len(reward), batch_num_tokens=int(mask.sum()))
    log_prob = old.to("meta").requires_grad_()
    return config, log_prob, {key: value.to("meta") for key, value in padded.items()}


def test_the_fused_loss_reads_nothing_back_to_the_host_before_its_one_metric_read():
    for mode in ("tb", "tb_pg"):
        config, log_prob, padded = padded_on_meta(mode)
        loss, stats = fused.fused_terms(config, log_prob, padded, 0.05, mode, 4)
        assert loss.device.type == "meta" and loss.shape == ()
        assert {value.device.type for value in stats.values()} == {"meta"}
        assert all(value.shape == () for value in stats.values())
        loss.backward()  # the backward too
        assert log_prob.grad.device.type == "meta"


def test_the_registered_three_call_losses_run_on_the_meta_device():
    """verl's ppo_loss calls them on the device; their metrics stay tensors for verl's Metric to read."""
    old = torch.randn(4, 5, device="meta")
    mask = torch.ones(4, 5, dtype=torch.bool, device="meta")
    config = ActorConfig()
    config.global_batch_info.update(global_batch_size=4)
    for mode, weights in (("tb", None), ("tb_pg", torch.ones(4, 5, device="meta"))):
        theta = old.clone().requires_grad_()
        loss, metrics = get_policy_loss_fn(mode)(
            old_log_prob=old,
            log_prob=theta,
            advantages=torch.randn(4, 5, device="meta"),
            response_mask=mask,
            loss_agg_mode=config.loss_agg_mode,
            config=config,
            rollout_is_weights=weights,
        )
        assert loss.device.type == "meta" and {m.device.type for m in metrics.values()} == {"meta"}


def test_group_statistics_stay_on_the_device_of_their_inputs():
    labels = torch.tensor([9, 4, 9, 4, 2, 2], device="meta")
    groups, sizes = tb.first_member(labels)
    assert groups.device.type == sizes.device.type == "meta"
    values = torch.randn(6, device="meta")
    assert tb.group_mean(values, groups, n_groups=6).device.type == "meta"
    # and the same on the CPU, against the definition
    labels, values = torch.tensor([9, 4, 9, 4, 2, 2]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 7.0])
    groups, sizes = tb.first_member(labels)
    assert groups.tolist() == [0, 1, 0, 1, 4, 4] and sizes.tolist() == [2] * 6
    assert tb.group_mean(values, groups, n_groups=6).tolist() == [2.0, 3.0, 2.0, 3.0, 6.0, 6.0]


def test_reference_log_probs_take_the_device_and_dtype_of_the_batch_they_replace_rows_of():
    """verl's infer_batch returns the reference's log-probs on the CPU in float32; the update's batch keeps its own
    device and dtype (a nested tensor on the meta device cannot be unbound, so the dtype stands in here)."""
    batch = torch.nested.as_nested_tensor([torch.zeros(3), torch.zeros(2), torch.zeros(4)], layout=torch.jagged)
    values = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -4.0, -5.0, -6.0])]
    merged = replace_rows(batch.to(torch.float64), [1, 2], values)
    assert [row.tolist() for row in merged.unbind()] == [[0.0] * 3, [-1.0, -2.0], [-3.0, -4.0, -5.0, -6.0]]
    assert merged.dtype == torch.float64 and merged.device == batch.device


def test_served_rows_move_to_the_device_whole_in_the_dtypes_verl_expects():
    """A replayed row rebuilt from the store's compact form, in TransferQueue's TensorDict form, moved as verl's
    engine moves a micro-batch: every per-token field is a tensor that moves (none left on the CPU as a numpy array
    or a list), with the dtypes of verl's own rows."""
    rows = []
    for session, response in enumerate(([8, 9, 10, 2], [8, 2])):
        row, tag = agent_loop_row([5, 6, 7], response, [1] * len(response), 1.0, session_id=session)
        prompt, response, logprobs, reward, extras = split_row(row, tag)
        rows.append(build_row(load_prompt(prompt), response, logprobs, reward, extras, uid="u0")[0])
    served = list_of_dict_to_tensordict(rows)
    on_device = served.to("meta")
    dtypes = {
        "prompts": torch.int64,
        "responses": torch.int64,
        "input_ids": torch.int64,
        "position_ids": torch.int64,
        "response_mask": torch.int64,
        "loss_mask": torch.int64,
        "rm_scores": torch.float32,
        "rollout_log_probs": torch.float32,
    }
    for key, dtype in dtypes.items():
        assert isinstance(on_device[key], torch.Tensor) and on_device[key].device.type == "meta", key
        assert on_device[key].dtype == served[key].dtype == dtype, key
