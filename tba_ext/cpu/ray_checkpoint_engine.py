"""``checkpoint_engine.backend=ray_object_store``: weight sync from trainer to searchers through Ray's object store.

verl's non-colocated checkpoint engines (nccl, nixl, mooncake, ...) need GPUs or RDMA libraries; on CPU
verl's separate_async mode stops at "Checkpoint engine nccl not registered". Here trainer rank 0 gathers the
full weights once per sync, puts them in the object store and publishes the reference in a named mailbox
actor; every rollout worker fetches that reference. Selected with
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tba_ext.cpu.ray_checkpoint_engine``.
"""

from __future__ import annotations

# ruff: noqa: E402
# Defined before the imports: imported before verl, this module reaches verl's plugin loading (which reads BACKEND
# from it) from its own verl import below.
BACKEND = "ray_object_store"

import asyncio
import contextlib
import time
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

MAILBOX = "tba_ext_weight_mailbox"


@ray.remote(num_cpus=0)
class WeightMailbox:
    """Holds the newest published weights (an object ref) and its version. A receiver blocks in ``wait_for``
    until its version is published (an asyncio condition), instead of polling: a poll interval would be added to
    every sync, whose receiver starts at the same moment as the sender."""

    def __init__(self):
        self.version, self.refs, self.published_at = None, None, 0.0
        self._published = asyncio.Condition()

    async def publish(self, version, refs: list) -> None:
        async with self._published:
            self.version, self.refs, self.published_at = version, refs, time.time()
            self._published.notify_all()

    async def latest(self) -> tuple[Any, list | None]:
        return self.version, self.refs

    async def wait_for(self, version, timeout_s: float) -> tuple[Any, list | None]:
        """(version, refs) as soon as ``version`` (None: any) is published; the newest ones after ``timeout_s``."""

        def arrived():
            return self.refs is not None and (version is None or self.version == version)

        async with self._published:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._published.wait_for(arrived), timeout_s)
            return self.version, self.refs


def full_cpu_state(weights: Generator[tuple[str, torch.Tensor], None, None]) -> dict[str, torch.Tensor]:
    """Drain a trainer's (name, tensor) generator into full CPU tensors. Every rank must drain it: FSDP's
    gathers behind it are collective."""
    state = {}
    for name, tensor in weights:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        state[name] = tensor.detach().to("cpu", copy=True)
    return state


def _mailbox():
    # Detached: whichever process creates the mailbox first (trainer or searcher) may die or drop its handle
    # (a searcher is SIGKILLed in the crash test); a non-detached actor would die with its creator's
    # references. The run's Ray cluster, and the mailbox with it, ends with the run.
    return WeightMailbox.options(name=MAILBOX, get_if_exists=True, lifetime="detached").remote()


def latest_published() -> tuple[Any, dict | None]:
    """(version, state dict) of the newest published weights, or (None, None) if nothing was published."""
    if not ray.is_initialized():
        return None, None
    try:
        mailbox = ray.get_actor(MAILBOX)
    except ValueError:
        return None, None
    version, refs = ray.get(mailbox.latest.remote())
    return (version, ray.get(refs[0])) if refs else (None, None)


@CheckpointEngineRegistry.register(BACKEND)
class RayObjectStoreCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int = 0, is_master: bool = False, timeout_s: float = 600.0, **kwargs):
        self.is_master = is_master
        self.timeout_s = timeout_s
        self.rank, self.role = 0, "receiver"
        self.last_sync_seconds = 0.0
        self._mailbox_handle = None

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        return (
            {"rank": list(range(actor_wg_world_size)), "role": ["sender"] * actor_wg_world_size},
            {"rank": list(range(rollout_world_size)), "role": ["receiver"] * rollout_world_size},
        )

    def init_process_group(self, rank: int = 0, role: str = "receiver", **kwargs):
        self.rank, self.role = rank, role

    def finalize(self):
        return None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps=None):
        start = time.perf_counter()
        state = full_cpu_state(weights)
        if self.rank == 0:
            ref = ray.put(state)
            await self._mailbox().publish.remote(global_steps, [ref])  # list: pass the ref, not its value
        self.last_sync_seconds = time.perf_counter() - start
        return {"tba/weight_sync_send_s": self.last_sync_seconds}

    def _mailbox(self):
        # looked up once per engine: a named-actor lookup is a round trip to Ray's GCS on every sync
        if self._mailbox_handle is None:
            self._mailbox_handle = _mailbox()
        return self._mailbox_handle

    def receive_weights(self, global_steps=None) -> Generator[tuple[str, torch.Tensor], None, None]:
        version, refs = ray.get(self._mailbox().wait_for.remote(global_steps, self.timeout_s))
        if refs is None or (global_steps is not None and version != global_steps):
            raise TimeoutError(
                f"no weights for version {global_steps} published within {self.timeout_s}s (newest: {version})"
            )
        yield from ray.get(refs[0]).items()
