"""verl's actor and reference workers in this process on one device, and batches in the layout verl's engine
trains on: what ``trainer_passes_gpu.py`` and ``gpu_smoke.py`` drive.

``Workers`` builds two of verl's ``ActorRolloutRefWorker``s, roles "actor" and "ref", each with its own
``init_model``, over a one-rank process group, from a config composed as a run composes it: tba-ext's ``cpu_tb`` or
``cpu_tb_pg`` overlay on verl's ppo_trainer.yaml, with the model, dtypes and batch sizes set here (its rollout and
Ray keys are not read). The actor's loss is tba-ext's fused loss (``install_fused_loss``: ``fused_tb_loss`` with
the worker's own ``FSDPActorConfig``), and its update first computes the reference log-probs of the rows marked
for it (``install_reference_in_update``, as a run with ``tba.ref_in_update`` does). verl's FSDP engine splits
each update into micro-batches (``prepare_micro_batches``; whole groups with ``force_group_size``), moves each to
the device and calls the loss on it. The one step of a run left out: the reference log-probs computed in the
update are not written to TransferQueue, where the trainer's store reads them (the stand-in for verl's worker
holding both models collects nothing).

verl is imported inside the functions: ``one_rank_process`` decides the platform (``--device cpu`` on a GPU host)
before verl loads.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import tempfile
from types import SimpleNamespace

import numpy as np
import torch

# Qwen2.5-0.5B's shape (its config.json); tiny: the CPU checks of the scripts
SIZES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}
BETA = 0.05
DRIFT = 0.05  # the actor's distance from the reference at the start (``Workers.drift``)
VERL_DTYPE = {"bfloat16": "bf16", "float32": "fp32"}
# what ``one_rank_process`` and verl's ``Worker`` set in this process's environment
PROCESS_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "REDIS_STORE_SERVER_HOST",
    "TBA_EXT_CPU_RUNTIME",
)


def one_rank_process(device: str) -> None:
    """The environment verl's workers read for a one-rank process group (a free port each time one is made), and
    on the CPU tba-ext's CPU runtime, before verl is imported."""
    if device == "cpu":
        os.environ.setdefault("TBA_EXT_CPU_RUNTIME", "on")
    elif not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch sees no CUDA device here (use --device cpu)")
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        os.environ.setdefault(key, value)


def save_model(size: str, folder: str, seed: int = 0):
    """A Qwen2 of ``size`` with random weights (float32), saved as verl loads a model; returns its config."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SIZES[size], max_position_embeddings=8192)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return config


def run_config(
    name: str, model_dir: str, device: str, dtype: str, groups: int, group_size: int, response_len: int, lr: float
):
    """The run config the workers are built from: tba-ext's config ``name`` (cpu_tb: verl's ppo_loss runs loss_mode
    tb; cpu_tb_pg: TBA''s loss_agg_mode and loss_scale_factor = the response length), beta ``BETA``, one group per
    micro-batch, ``dtype`` the forward's precision (float32 master weights and optimizer state, as verl trains;
    the reference held in ``dtype``)."""
    from tba_ext.tools.config import compose

    verl_dtype = VERL_DTYPE[dtype]
    prefix = "actor_rollout_ref"
    overrides = [
        f"algorithm.kl_ctrl.kl_coef={BETA}",
        f"{prefix}.model.path={model_dir}",
        f"+{prefix}.model.load_tokenizer=false",  # random token ids: no tokenizer
        f"{prefix}.model.enable_gradient_checkpointing={device != 'cpu'}",
        f"data.max_response_length={response_len}",
        f"{prefix}.rollout.n={group_size}",
        f"{prefix}.rollout.log_prob_micro_batch_size_per_gpu={group_size}",
        f"{prefix}.actor.ppo_mini_batch_size={groups}",
        f"{prefix}.actor.ppo_micro_batch_size_per_gpu={group_size}",
        f"{prefix}.actor.optim.lr={lr}",
        f"{prefix}.actor.fsdp_config.mixed_precision.param_dtype={verl_dtype}",
        f"{prefix}.ref.log_prob_micro_batch_size_per_gpu={group_size}",
        f"{prefix}.ref.fsdp_config.model_dtype={verl_dtype}",
        f"{prefix}.ref.fsdp_config.mixed_precision.param_dtype={verl_dtype}",
    ]
    return compose(name, overrides)


@contextlib.contextmanager
def built(
    config_name: str, size: str, device: str, dtype: str, groups: int, group_size: int, response_len: int, lr: float
):
    """``Workers`` over a freshly saved model of ``size`` (``run_config``), the actor drifted from the reference;
    yields (workers, config, model folder); after, the process group is gone and ``PROCESS_ENV`` as it was."""
    saved = {key: os.environ.get(key) for key in PROCESS_ENV}
    one_rank_process(device)
    try:
        with tempfile.TemporaryDirectory() as model_dir:
            save_model(size, model_dir)
            config = run_config(config_name, model_dir, device, dtype, groups, group_size, response_len, lr)
            workers = Workers(config)
            try:
                workers.drift()
                yield workers, config, model_dir
            finally:
                workers.close()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient of the FSDP2 module as one tensor (a DTensor's whole value)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class Workers:
    """verl's actor worker (fused loss, reference forward in the update) and reference worker, in this process."""

    def __init__(self, config):
        from verl.workers.engine_workers import ActorRolloutRefWorker

        from tba_ext.adapters import fused, reference

        self.actor = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
        self.actor.init_model()
        self.ref = ActorRolloutRefWorker(config.actor_rollout_ref, role="ref")
        self.ref.init_model()
        self.ppo_loss = self.actor.loss_fn  # verl's ppo_loss with the actor config: the three-call update's
        fused.install_fused_loss(self.actor)
        self.fused_loss = self.actor.actor.loss_fn
        # stands in for the Ray actor of a run holding both models (verl's WorkerDict); it stores nothing in
        # TransferQueue
        colocated = SimpleNamespace(actor=self.actor.actor, ref=self.ref.ref, query_collect_info=lambda mesh: False)
        reference.install_reference_in_update(colocated, ref_in_actor=False)
        self.keep_gradient, self.gradient = False, None
        engine = self.actor.actor.engine
        step = engine.optimizer_step

        def optimizer_step():  # verl zeroes the gradients when the update's call ends: read them before its clip
            if self.keep_gradient:
                self.gradient = {
                    name: full(p.grad).detach().float().clone()
                    for name, p in self.module.named_parameters()
                    if p.grad is not None
                }
            return step()

        engine.optimizer_step = optimizer_step

    @property
    def module(self):
        return self.actor.actor.engine.module

    def set_loss(self, loss_fn) -> None:
        self.actor.actor.set_loss_fn(loss_fn)

    def update(self, data, keep_gradient: bool = False) -> dict:
        """verl's ``update_actor`` on ``data`` (an ``update_batch``): its metrics, one value each; with
        ``keep_gradient`` the gradient before verl's clip and step in ``self.gradient`` (name -> float32)."""
        self.keep_gradient, self.gradient = keep_gradient, None
        metrics = self.actor.update_actor(data)["metrics"]
        return {key: float(np.mean(value)) for key, value in metrics.items()}

    def log_probs(self, batch, role: str, calculate_entropy: bool = False) -> torch.Tensor:
        """verl's ``compute_log_prob`` (actor) or ``compute_ref_log_prob`` (ref) on ``batch``: the response
        log-probs, nested, as the trainer writes them back (``response_from_nested``)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import response_from_nested

        data = batch.copy()
        tu.assign_non_tensor(data, calculate_entropy=calculate_entropy, compute_loss=False, temperature=1.0)
        call = self.actor.compute_log_prob if role == "actor" else self.ref.compute_ref_log_prob
        return response_from_nested(call(data)["log_probs"], batch["response_mask"])

    def weights(self, role: str = "actor") -> dict:
        module = self.module if role == "actor" else self.ref.ref.engine.module
        return {name: full(t).detach().clone() for name, t in module.state_dict().items()}

    def drift(self, scale: float = DRIFT, seed: int = 3) -> None:
        """Move the actor away from the reference, as some training would: every weight times (1 + scale * noise),
        seeded, in place on this rank's shard. Without it the two are one model at the start, every KL term
        vanishes and a reference forward run on the actor's weights would go unnoticed."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in sorted(self.module.named_parameters()):
                local = p.to_local() if hasattr(p, "to_local") else p
                local.mul_(1 + scale * torch.randn(local.shape, generator=g).to(local))

    @contextlib.contextmanager
    def frozen(self):
        """An update that leaves the weights as they are (learning rate 0 until its step; verl's scheduler sets the
        rate again after), for comparing two updates at one theta."""
        groups = self.actor.actor.engine.optimizer.param_groups
        saved = [group["lr"] for group in groups]
        for group in groups:
            group["lr"] = 0.0
        try:
            yield
        finally:
            for group, lr in zip(groups, saved):
                group["lr"] = lr

    def close(self) -> None:
        """Ends the process group the workers made (a later ``Workers`` makes its own)."""
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def make_batch(n_groups: int, group_size: int, prompt_len: int, response_len: int, vocab: int, seed: int = 1):
    """Prompt groups of ``group_size`` responses as verl's V1 trainer hands them to the update: a TensorDict with
    per-token fields nested (jagged; response lengths vary within a group), the reward on the last response token
    (``rm_scores``), ``tba_group`` the dense group index the trainer writes, every row marked for the reference
    forward in the update (``tba_ref_todo``) with placeholder ``ref_log_prob``, ``uid`` the prompt's id."""
    from tensordict import NonTensorStack, TensorDict

    from tba_ext.core import wire

    g = torch.Generator().manual_seed(seed)
    rows = []
    for group in range(n_groups):
        prompt = torch.randint(vocab, (prompt_len,), generator=g)
        for _ in range(group_size):
            length = int(torch.randint(response_len // 2, response_len + 1, (1,), generator=g))
            response = torch.randint(vocab, (length,), generator=g)
            reward = torch.zeros(length)
            reward[-1] = float(torch.randint(0, 2, (1,), generator=g))
            ones = torch.ones(length, dtype=torch.long)
            input_ids = torch.cat([prompt, response])
            rows.append(
                {
                    "prompts": prompt,
                    "responses": response,
                    "response_mask": ones,
                    "loss_mask": ones,
                    "input_ids": input_ids,
                    "position_ids": torch.arange(len(input_ids)),
                    "attention_mask": torch.ones(len(input_ids), dtype=torch.long),
                    "rm_scores": reward,
                    "rollout_log_probs": torch.zeros(length),
                    "ref_log_prob": torch.zeros(length),
                    wire.GROUP_FIELD: torch.tensor(group),
                    wire.TODO_FIELD: torch.tensor(1, dtype=torch.int8),
                }
            )
    fields = {
        key: torch.stack(values) if values[0].dim() == 0 else torch.nested.as_nested_tensor(values, layout=torch.jagged)
        for key, values in ((key, [row[key] for row in rows]) for key in rows[0])
    }
    fields["uid"] = NonTensorStack(*[f"p{i // group_size}" for i in range(len(rows))])
    return TensorDict(fields, batch_size=[len(rows)])


def nested(values: list[torch.Tensor]) -> torch.Tensor:
    """Per-row float values as a jagged field of a batch (on the CPU, as the trainer's batches arrive)."""
    return torch.nested.as_nested_tensor([v.detach().float().cpu() for v in values], layout=torch.jagged)


def update_batch(batch, mode: str, group_size: int, micro_groups: int = 1, reference_in_update: bool = True):
    """``batch`` with what the trainer adds before ``update_actor``: verl's update keys (``_update_actor``: one
    mini-batch of every row, no shuffle) and, for the fused update (``mode`` tb / tb_pg), tba-ext's
    (``_fused_update_actor``: beta, the mode, rollout.n, ``force_group_size``, ``micro_groups`` groups per
    micro-batch) and, ``reference_in_update``, the reference pass's micro-batch (one group)."""
    from verl.utils import tensordict_utils as tu

    from tba_ext.core import wire

    data = batch.copy()
    if not reference_in_update:
        data = data.exclude(wire.TODO_FIELD)
    n = len(batch)
    tu.assign_non_tensor(
        data,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=n,
        mini_batch_size=n,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        temperature=1.0,
    )
    if mode in ("tb", "tb_pg"):
        tu.assign_non_tensor(
            data,
            **{wire.BETA_KEY: BETA, wire.MODE_KEY: mode, wire.GROUP_SIZE_KEY: group_size},
            force_group_size=group_size,
            micro_batch_size_per_gpu=micro_groups,
            **{wire.MICRO_BATCH_KEY: group_size},
        )
    else:  # verl's own micro-batch: rows
        tu.assign_non_tensor(data, micro_batch_size_per_gpu=micro_groups * group_size)
    return data


def on_meta_default_device(loss_fn):
    """``loss_fn`` run with torch's default device set to meta, inside verl's engine: a tensor it makes without an
    explicit device lands on meta and cannot meet the micro-batch's tensors (on a GPU, a CPU-made tensor meeting
    CUDA log-probs fails the same way; on the CPU this is the only way to see it; tests/test_device.py's
    stand-in)."""

    def guarded(*args, **kwargs):
        with torch.device("meta"):
            return loss_fn(*args, **kwargs)

    return guarded


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def flat(gradient: dict) -> torch.Tensor:
    return torch.cat([gradient[name].flatten() for name in sorted(gradient)])


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"


def provenance(device: str) -> dict:
    """``common.provenance`` (commit, versions, machine, date) and the device the updates ran on."""
    from common import provenance as machine_provenance

    return {**machine_provenance(), "device": device_name(device)}
