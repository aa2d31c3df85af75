"""``rollout.name=hfcpu``: a transformers-generation rollout server that speaks verl's vLLM server protocol.

verl 0.9.1 registers only vLLM, SGLang and TensorRT-LLM rollout backends, all GPU builds. This backend
gives the agent loop what vLLM gives it: token ids, sampled-token log-probs at the rollout temperature
(log_softmax(logits / T), vLLM's "processed" log-probs), a stop reason and the weight version
(``global_steps``), and it takes weight updates from the trainer. Concurrent requests are batched: the
server collects every request that arrives while a batch is generating, and those of one dispatch still
arriving, and runs them together; with ``rollout.custom.min_batch_prompts`` (the decoupled configs) a batch first
waits, up to 2 s, for this searcher's share of one dispatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from tba_ext.core import hold
from tba_ext.core.wire import SEARCHER_REFERENCE

logger = logging.getLogger(__name__)

SERVER_NAME = "tba_hfcpu_server_{replica_rank}"


def check_hfcpu_lora(model: dict) -> None:
    """hfcpu loads full weights only; verl sends a LoRA run's adapter on its own unless it merges it first."""
    lora = model.get("lora") or {}
    if (model.get("lora_rank", 0) or lora.get("rank", 0) or model.get("lora_adapter_path")) and not lora.get("merge"):
        raise ValueError(
            "actor_rollout_ref.rollout.name=hfcpu takes full weights: a LoRA run on it needs "
            "actor_rollout_ref.model.lora.merge=True (verl then merges the adapter before each weight sync)"
        )


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    ignore_eos: bool
    future: asyncio.Future = field(repr=False)

    @property
    def sampling_key(self) -> tuple:
        return (self.temperature, self.top_p, self.top_k, self.ignore_eos)


def _trace(record: dict) -> None:
    """With TBA_EXT_ROLLOUT_TRACE=<file>: tests see from outside Ray which weights the rollout serves and
    when a batch is being generated."""
    path = os.environ.get("TBA_EXT_ROLLOUT_TRACE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(record, time=time.time(), pid=os.getpid())) + "\n")


def request_seed(server_seed: int, prompt_ids: list[int], occurrence: int) -> int:
    """The sampling seed of the ``occurrence``-th request (from 0) for this prompt on this server."""
    digest = hashlib.blake2b(repr((server_seed, tuple(prompt_ids), occurrence)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _SeededSampling(LogitsProcessor):
    """Draws each row's next token from that request's own uniforms (inverse CDF: the first token whose cumulative
    probability exceeds u), then hands HF a one-hot score so its multinomial keeps exactly that token. A request's
    sample then depends on its seed only, never on which other requests share its batch (vLLM's per-request seed):
    with one replica, the same prompts give the same rollouts however the trainer is laid out (the data-parallel
    equivalence test relies on it). The uniforms are drawn once per request, so a step costs a few batched tensor
    operations rather than one generator call per row."""

    def __init__(self, uniforms: torch.Tensor):
        self.uniforms = uniforms  # (batch, max_new_tokens), one row per request
        self.step = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cdf = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1)
        # scaled by the row's total so float rounding can never point past the last token of positive probability
        # and kept above zero so a leading run of zero-probability tokens (cdf exactly 0) is never picked
        u = (self.uniforms[:, self.step : self.step + 1] * cdf[:, -1:]).clamp_(min=torch.finfo(cdf.dtype).tiny)
        self.step += 1
        picks = (cdf < u).sum(dim=-1).clamp_(max=scores.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter_(1, picks.unsqueeze(1), 0.0)


def generate_batch(model, requests: list[_Request], pad_token_id: int, eos_token_ids: set[int]) -> list[dict]:
    """Left-pad the prompts, sample with HF ``generate`` and return per-request tokens and log-probs.

    All requests share temperature/top-p/top-k (the caller groups them); each samples with its own seed.
    Log-probs are those of the sampled token under log_softmax(logits / T) (T = 1 for greedy), which is what
    verl's trainer recomputes as old_log_prob at the same temperature.
    """
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((len(requests), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, r in enumerate(requests):
        input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        attention_mask[i, width - len(r.prompt_ids) :] = 1
    temperature = requests[0].temperature
    greedy = temperature <= 0
    max_new_tokens = max(r.max_tokens for r in requests)
    kwargs: dict[str, Any] = dict(do_sample=not greedy)
    if not greedy:
        # HF puts its own warpers after custom processors, so the warpers are given here, before the sampler
        warpers = [TemperatureLogitsWarper(temperature)]
        if requests[0].top_k:
            warpers.append(TopKLogitsWarper(requests[0].top_k))
        if requests[0].top_p < 1.0:
            warpers.append(TopPLogitsWarper(requests[0].top_p))
        # each request's own max_tokens uniforms (a prefix of a longer draw need not equal a shorter draw)
        uniforms = torch.zeros(len(requests), max_new_tokens)
        for i, r in enumerate(requests):
            uniforms[i, : r.max_tokens] = torch.rand(r.max_tokens, generator=torch.Generator().manual_seed(r.seed))
        sampler = _SeededSampling(uniforms)
        kwargs.update(temperature=1.0, top_p=1.0, top_k=0, logits_processor=LogitsProcessorList([*warpers, sampler]))
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id,
            # verl's rollout.ignore_eos (as vLLM's): an EOS is sampled like any token and generation goes on
            eos_token_id=None if requests[0].ignore_eos else sorted(eos_token_ids),
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    new_tokens = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float()  # (B, new, V), raw (unprocessed) logits
    logprobs = torch.log_softmax(logits / (1.0 if greedy else temperature), dim=-1)
    token_logprobs = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
    results = []
    for i, r in enumerate(requests):
        tokens = new_tokens[i, : r.max_tokens].tolist()
        stop = "length"
        for t, tok in enumerate([] if r.ignore_eos else tokens):
            if tok in eos_token_ids:
                tokens, stop = tokens[: t + 1], "completed"
                break
        results.append(dict(token_ids=tokens, log_probs=token_logprobs[i, : len(tokens)].tolist(), stop=stop))
    return results


def reference_logprobs(model, requests: list[_Request], results: list[dict]) -> None:
    """The reference's log-probs of each sampled response, at the sampling temperature, into ``results``
    (``ref_log_probs``): the TBA searcher's second forward, with its own copy of the initial model, so the
    trainer need not run the reference on this data. Right-padded, one forward for the batch."""
    sequences = [r.prompt_ids + res["token_ids"] for r, res in zip(requests, results)]
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, s in enumerate(sequences):
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    for i, (r, res) in enumerate(zip(requests, results)):
        start, tokens = len(r.prompt_ids), res["token_ids"]
        logprobs = torch.log_softmax(logits[i, start - 1 : start - 1 + len(tokens)] / r.temperature, dim=-1)
        res["ref_log_probs"] = logprobs.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()


class HFCPUServer:
    """Ray actor holding one HF model copy; generation batches run in a thread. New weights are received at once
    and applied between batches: a batch runs to completion with the weights it started with (and is stamped
    with their version), the next starts with the newest, and the trainer never waits for a running batch.
    With ``reference``, a second copy of the initial model (never updated) scores every sampled response, as the
    TBA reference's searchers do; the log-probs travel with the trajectory (``rows.SEARCHER_REFERENCE``)."""

    def __init__(
        self,
        model_path: str,
        prompt_length: int,
        response_length: int,
        seed: int,
        max_batch: int = 256,
        reference: bool = False,
        ignore_eos: bool = False,
        min_batch: int = 0,
    ):
        torch.set_num_threads(int(os.environ.get("TBA_EXT_ROLLOUT_THREADS", "1")))
        from transformers import AutoConfig, AutoModelForCausalLM

        if not os.path.isdir(model_path):
            raise FileNotFoundError(f"actor_rollout_ref.model.path: no model directory at {model_path}")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        # the reference is the initial model, as verl's reference worker loads it from the same path
        self.reference = (
            AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval() if reference else None
        )
        cfg = AutoConfig.from_pretrained(model_path)
        gen_cfg = self.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else cfg.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        self.ignore_eos = ignore_eos  # verl's rollout.ignore_eos: every response runs to its max_tokens
        self.pad_token_id = gen_cfg.pad_token_id if gen_cfg.pad_token_id is not None else min(self.eos_token_ids)
        self.prompt_length, self.response_length = prompt_length, response_length
        self.max_batch = max_batch
        if not 0 <= min_batch <= max_batch:
            raise ValueError(
                f"actor_rollout_ref.rollout.custom.min_batch_prompts x rollout.n = {min_batch} requests: "
                f"must be between 0 and the server's max_batch {max_batch}"
            )
        self.min_batch = min_batch
        self.global_steps: int | None = None
        self.weight_loads = 0
        self.staged: tuple[dict, int | None] | None = None  # received, applied before the next batch
        self.pending: list[_Request] = []
        self.last_arrival = 0.0  # event-loop time of the newest request
        self.wakeup = asyncio.Event()
        self.arrived = asyncio.Event()  # set by every request (min_batch waits on it)
        self.model_lock = asyncio.Lock()
        self.busy_seconds = 0.0
        self.batches = 0
        self.batch_sizes: list[int] = []
        self.generated = 0
        self.seed = seed
        self.prompt_requests: dict[tuple, int] = {}  # requests per prompt so far: a request's seed (request_seed)
        self.loop_task = None
        self._load_published_weights()

    def _load_published_weights(self) -> None:
        """A searcher restarted after a crash starts from the newest weights the trainer published
        (decoupled mode), not from the initial checkpoint."""
        from tba_ext.cpu.ray_checkpoint_engine import latest_published

        try:
            version, state = latest_published()
        except Exception as exc:
            logger.warning("tba-ext: could not read published weights (%s)", exc)
            version, state = None, None
        if state is not None:
            self.model.load_state_dict(state, strict=False)
            self.global_steps = version
            print(f"tba-ext: searcher started with published weights of version {version}", flush=True)
        else:
            # the model directory holds the initial weights: version 0 until the trainer's next sync
            self.global_steps = 0

    def _ensure_loop(self):
        if self.loop_task is None:
            self.loop_task = asyncio.get_running_loop().create_task(self._batch_loop())

    # A batch starts once no request has arrived for JOIN_QUIET_S, or JOIN_MAX_S after it could start. verl's agent
    # loop issues one dispatch's requests over about half a second on a busy CPU (a TransferQueue put, the chat
    # template and a load-balancer call per request; gaps up to ~0.15 s measured on 2 cores); a batch started at the
    # first arrival generates a handful of them, the rest wait and pay a second full-length generation, and a
    # generation step costs nearly as much for 4 rows as for 64 on CPU.
    JOIN_QUIET_S = 0.1
    JOIN_MAX_S = 0.5
    # With ``min_batch`` (decoupled searchers, whose queue holds more than one dispatch), a batch first waits for that
    # many requests, up to MIN_BATCH_WAIT_S: on a CPU shared with the trainer the agent loop's requests trickle in
    # with gaps longer than JOIN_QUIET_S, and a batch of 8 or 32 rows costs 2.6x or 1.2x the generation CPU per row
    # of a batch of 64 (the `small` model, 64 tokens).
    MIN_BATCH_WAIT_S = 2.0

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        full_by = loop.time() + self.MIN_BATCH_WAIT_S
        while len(self.pending) < self.min_batch and loop.time() < full_by:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), full_by - loop.time())
        deadline = loop.time() + self.JOIN_MAX_S
        while len(self.pending) < self.max_batch:
            quiet_until = self.last_arrival + self.JOIN_QUIET_S
            now = loop.time()
            if now >= quiet_until or now >= deadline:
                return
            await asyncio.sleep(min(quiet_until, deadline) - now)

    async def _batch_loop(self):
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            while self.pending:
                await self._gather()
                key = self.pending[0].sampling_key
                batch = [r for r in self.pending if r.sampling_key == key][: self.max_batch]
                self.pending = [r for r in self.pending if not any(r is b for b in batch)]
                async with self.model_lock:
                    self._apply_staged()
                    if hold.armed():  # a fault test's hold point; no thread hop per batch otherwise
                        await asyncio.to_thread(hold.hold_point, "generate_begin", self.global_steps)
                    start = time.perf_counter()
                    _trace({"event": "generate_begin", "requests": len(batch)})
                    try:
                        results = await asyncio.to_thread(
                            generate_batch, self.model, batch, self.pad_token_id, self.eos_token_ids
                        )
                        if self.reference is not None and batch[0].temperature > 0:  # training samples
                            await asyncio.to_thread(reference_logprobs, self.reference, batch, results)
                    except Exception as exc:  # surface the failure to every waiting request
                        for r in batch:
                            r.future.set_exception(exc)
                        continue
                    _trace({"event": "generate_end"})
                    self.busy_seconds += time.perf_counter() - start
                    self.batches += 1
                    self.batch_sizes.append(len(batch))
                    self.generated += len(batch)
                    version = self.global_steps
                for r, res in zip(batch, results):
                    r.future.set_result((res, version))

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **kwargs
    ) -> TokenOutput:
        self._ensure_loop()
        params = dict(sampling_params)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        budget = self.prompt_length + self.response_length - len(prompt_ids)
        max_tokens = min(max_tokens or self.response_length, self.response_length, budget)
        if max_tokens < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room to generate "
                f"(data.max_prompt_length + data.max_response_length = {self.prompt_length + self.response_length})"
            )
        request = _Request(
            prompt_ids=list(prompt_ids),
            max_tokens=int(max_tokens),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=max(int(params.get("top_k") or 0), 0),  # verl's -1 / None mean "no top-k"; HF's is 0
            seed=request_seed(self.seed, prompt_ids, self._occurrence(prompt_ids)),
            ignore_eos=bool(params.get("ignore_eos", self.ignore_eos)),
            future=asyncio.get_running_loop().create_future(),
        )
        self.pending.append(request)
        self.last_arrival = asyncio.get_running_loop().time()
        self.arrived.set()
        self.wakeup.set()
        res, version = await request.future
        extra = {"global_steps": version, "finish_reason": res["stop"]}
        if "ref_log_probs" in res:
            extra[SEARCHER_REFERENCE] = res["ref_log_probs"]
        return TokenOutput(
            token_ids=res["token_ids"], log_probs=res["log_probs"], stop_reason="completed", extra_fields=extra
        )

    def _occurrence(self, prompt_ids: list[int]) -> int:
        key = tuple(prompt_ids)
        self.prompt_requests[key] = self.prompt_requests.get(key, -1) + 1
        return self.prompt_requests[key]

    async def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None) -> dict:
        """Receive new weights: checked now, applied now if no batch runs, else right after it (never under a
        running batch). A newer version received meanwhile replaces an unapplied one."""
        names = set(self.model.state_dict())
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        unexpected, missing = set(state_dict) - names, names - set(state_dict) - tied
        if unexpected or missing:
            raise RuntimeError(
                f"hfcpu weight update does not match the model: missing={sorted(missing)}, "
                f"unexpected={sorted(unexpected)}"
            )
        self.staged = (state_dict, global_steps)
        if not self.model_lock.locked():
            async with self.model_lock:
                self._apply_staged()
        return {"global_steps": global_steps, "weight_loads": self.weight_loads}

    def _apply_staged(self) -> None:
        """Called holding ``model_lock``."""
        if self.staged is None:
            return
        (state_dict, global_steps), self.staged = self.staged, None
        self.model.load_state_dict(state_dict, strict=False)
        self.global_steps = global_steps
        self.weight_loads += 1
        if os.environ.get("TBA_EXT_ROLLOUT_TRACE"):
            _trace({"event": "weights", "global_steps": global_steps, "checksum": self._checksum()})

    async def stats(self) -> dict:
        return dict(
            generated=self.generated,
            global_steps=self.global_steps,
            weight_loads=self.weight_loads,
            batches=self.batches,
            mean_batch_size=(sum(self.batch_sizes) / len(self.batch_sizes)) if self.batch_sizes else 0.0,
            busy_seconds=self.busy_seconds,
        )

    def _checksum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().abs().sum() for p in self.model.parameters()))

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    # The control surface verl's replicas expose; memory is not released on CPU, and requests run to
    # completion (no partial rollout), so these are no-ops.
    async def wake_up(self, *args, **kwargs):
        return None

    async def sleep(self, *args, **kwargs):
        return None

    async def clear_kv_cache(self, *args, **kwargs):
        return None

    async def release_kv_cache(self, *args, **kwargs):
        return None

    async def resume_kv_cache(self, *args, **kwargs):
        return None

    async def abort_all_requests(self, *args, **kwargs):
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, *args, **kwargs):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self, *args, **kwargs):
        return None

    async def wait_for_requests_to_drain(self, *args, **kwargs):
        return None

    async def start_profile(self, *args, **kwargs):
        return None

    async def stop_profile(self, *args, **kwargs):
        return None


class HFCPUReplica(RolloutReplica):
    """One ``HFCPUServer`` actor per replica (single process; tensor parallel size 1)."""

    async def launch_servers(self):
        name = SERVER_NAME.format(replica_rank=self.replica_rank) + self.name_suffix
        server_cls = ray.remote(HFCPUServer)
        placement = {}
        if self.workers:  # on the node holding this replica's resources, as verl's vLLM servers are
            node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
            placement["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = server_cls.options(
            name=name,
            num_cpus=0,
            **placement,
            max_restarts=-1,  # a searcher that dies is restarted by Ray and reloads the newest weights
            max_task_retries=0,
            max_concurrency=self.max_concurrency,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
        ).remote(
            model_path=getattr(self.model_config, "local_path", None) or self.model_config.path,
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            seed=int(getattr(self.config, "seed", 0) or 0) + self.replica_rank,
            reference=bool((getattr(self.config, "custom", None) or {}).get("reference_logprobs", False)),
            ignore_eos=bool(getattr(self.config, "ignore_eos", False)),
            min_batch=self._min_batch(),
        )
        await server.stats.remote()  # fail here, with the server's own error, if the model cannot load
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hfcpu-replica-{self.replica_rank}{self.name_suffix}"

    def _min_batch(self) -> int:
        """This searcher's share of one dispatch's requests: ``custom.min_batch_prompts`` (the decoupled configs: one
        data fetch) x ``rollout.n``, over the standalone pool's searchers, among which verl's load balancer spreads
        the requests (least in flight first)."""
        prompts = int((getattr(self.config, "custom", None) or {}).get("min_batch_prompts", 0) or 0)
        pool = int(getattr(self.config, "nnodes", 1) or 1) * int(getattr(self.config, "n_gpus_per_node", 1) or 1)
        searchers = max(1, pool // max(1, self.world_size))
        return prompts * int(getattr(self.config, "n", 1) or 1) // searchers

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFCPUServerAdapter(BaseRollout):
    """Lives in the actor worker: forwards the trainer's weights to its replica's server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader_rank = rank % world == 0
        self._server = None

    @property
    def server(self):
        if self._server is None:
            self._server = ray.get_actor(SERVER_NAME.format(replica_rank=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], wire_format: str = "named_tensors", **kwargs
    ):
        if wire_format != "named_tensors":
            raise ValueError(f"hfcpu rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:  # a LoRA adapter alone (verl's run started without preflight)
            raise ValueError(
                "hfcpu rollout takes full weights, not a LoRA adapter: set actor_rollout_ref.model.lora.merge=True"
            )
        from tba_ext.cpu.ray_checkpoint_engine import full_cpu_state

        state = full_cpu_state(weights)  # drained on every rank; the leader ships the copy
        if self.is_leader_rank:
            await self.server.load_weights.remote(state, kwargs.get("global_steps"))
