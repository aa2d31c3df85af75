"""Every private verl symbol tba-ext relies on, by name and signature: a verl upgrade that moves one fails here,
naming it, in seconds, instead of deep inside a Ray worker.

The list is what tba_ext/adapters and tba_ext/cpu override, call or read; public registries (register_*,
get_*_fn) are exercised by the plugin tests.
"""

import inspect
import os

import pytest
import verl
from verl.single_controller.base import decorator as dispatch
from verl.single_controller.base.worker import Worker
from verl.trainer.ppo.v1 import trainer_base, trainer_colocate_async, trainer_separate_async
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.workers import engine_workers
from verl.workers.engine import utils as engine_utils
from verl.workers.rollout import llm_server
from verl.workers.utils import losses as verl_losses

PPOTrainer = trainer_base.PPOTrainer
SeparateAsync = trainer_separate_async.PPOTrainerSeparateAsync

# (owner, attribute, the parameter names tba-ext passes or receives, in order; None: only that it exists)
METHODS = [
    (PPOTrainer, "step", ["self", "metrics", "timing_raw"]),
    (PPOTrainer, "_step_once", ["self", "metrics", "timing_raw", "sample_batch_size"]),
    (PPOTrainer, "_balance_batch", ["self", "batch", "metrics", "logging_prefix", "keep_minibatch"]),
    (PPOTrainer, "_compute_old_log_prob", ["self", "batch", "metrics"]),
    (PPOTrainer, "_compute_ref_log_prob", ["self", "batch", "metrics"]),
    (PPOTrainer, "_compute_advantage", ["self", "batch", "metrics"]),
    (PPOTrainer, "_update_actor", ["self", "batch", "metrics"]),
    (PPOTrainer, "_compute_metrics", ["self", "batch", "metrics", "timing_raw", "global_steps", "epoch"]),
    (PPOTrainer, "_save_checkpoint", ["self"]),
    (PPOTrainer, "_load_checkpoint", ["self"]),
    (PPOTrainer, "_fetch_one_gen_batch", ["self"]),
    (PPOTrainer, "_init_dataloader", ["self"]),
    (PPOTrainer, "_init_tokenizer", ["self"]),
    (PPOTrainer, "on_init_end", ["self"]),
    (PPOTrainer, "on_step_begin", ["self"]),
    (PPOTrainer, "on_sample_begin", ["self"]),
    (SeparateAsync, "_add_batch_to_generate", ["self"]),
    (SeparateAsync, "_add_prompts_to_generate", ["self", "num_prompts"]),
    (SeparateAsync, "on_step_end", ["self"]),
    (SeparateAsync, "_rollout_server_managers", None),
    (SeparateAsync, "get_llm_client", ["self"]),
    (trainer_colocate_async.PPOTrainerColocateAsync, "get_llm_client", ["self"]),
    (llm_server.LLMServerManager, "get_client", None),
    (llm_server.FullyAsyncLLMServerClient, "generate", None),
    (llm_server.LLMServerClient, "generate", None),
    (ReplayBufferAsync, "sample", ["self", "global_steps", "partition_id", "batch_size"]),
    (ReplayBufferAsync, "_sync_metadata_from_transfer_queue", None),
    (ReplayBufferAsync, "_select_prompt_uids", None),
    (engine_workers.TrainingWorker, "set_loss_fn", ["self", "loss_fn"]),
    (engine_workers.TrainingWorker, "train_mini_batch", ["self", "data"]),
    (engine_workers.TrainingWorker, "infer_batch", ["self", "data"]),
    (Worker, "query_collect_info", ["self", "mesh_name"]),
    (engine_workers.ActorRolloutRefWorker, "compute_log_prob", ["self", "data"]),
    (engine_workers.ActorRolloutRefWorker, "compute_ref_log_prob", ["self", "data"]),
    (engine_workers.ActorRolloutRefWorker, "update_actor", ["self", "data"]),
    (verl_losses, "ppo_loss", ["config", "model_output", "data", "dp_group"]),
    (Worker, "_query_dispatch_info", ["self", "mesh_name"]),
]


def unwrapped(obj):
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return obj


@pytest.mark.parametrize("owner,name,params", METHODS, ids=[f"{getattr(o, '__name__', o)}.{n}" for o, n, _ in METHODS])
def test_verl_symbol_has_the_signature_tba_ext_uses(owner, name, params):
    assert hasattr(owner, name), f"verl no longer has {owner.__name__}.{name}"
    if params is not None:
        signature = inspect.signature(unwrapped(getattr(owner, name)))
        assert list(signature.parameters)[: len(params)] == params, f"{owner.__name__}.{name}{signature}"


def test_a_step_keeps_its_stage_timings_in_self_timing_raw():
    # the decoupled trainer times its searcher top-ups into the step's timing dict (timing_s/top_up)
    source = inspect.getsource(PPOTrainer.fit)
    assert "self.timing_raw = {}" in source and "self.step(metrics, self.timing_raw)" in source


def test_the_fused_update_relies_on_verls_micro_batching_and_loss_plumbing():
    # force_group_size keeps consecutive rows together (static and dynamic micro-batching)
    assert "force_group_size" in inspect.getsource(engine_utils.prepare_micro_batches)
    # the actor worker's loss is partial(ppo_loss, config=actor config): the fused loss takes the same config
    source = inspect.getsource(engine_workers.ActorRolloutRefWorker.init_model)
    assert "self.loss_fn = partial(ppo_loss, config=actor_config)" in source
    assert "self.actor.set_loss_fn(self.loss_fn)" in source
    # the global-batch normalisation the fused loss sets as ppo_loss does
    ppo_loss = inspect.getsource(verl_losses.ppo_loss)
    for key in ("dp_size", "batch_num_tokens", "global_batch_size"):
        assert f'config.global_batch_info["{key}"] = data["{key}"]' in ppo_loss, key


def test_the_reference_forward_inside_the_update_sits_where_verls_update_and_reference_calls_go():
    # update_actor calls the actor's train_mini_batch by keyword, so the instance attribute tba-ext sets is the
    # one that runs; the reference call is the reference engine's infer_batch, its log-probs cut to the response
    assert "self.actor.train_mini_batch(data=data)" in inspect.getsource(engine_workers.ActorRolloutRefWorker)
    assert "self.ref.infer_batch(data=data)" in inspect.getsource(engine_workers.ActorRolloutRefWorker)
    reference = inspect.getsource(PPOTrainer._compute_ref_log_prob)
    assert 'response_from_nested(data.pop("log_probs"), data["response_mask"])' in reference
    # the ref_in_actor (LoRA) reference: the actor with its adapter off, asked for by no_lora_adapter
    assert 'tu.pop(data, key="no_lora_adapter"' in inspect.getsource(engine_workers.TrainingWorker.infer_batch)


def test_the_data_parallel_size_is_read_as_verls_dispatch_computes_it():
    # reference.data_parallel_size fills and reads the worker group's dispatch cache as verl's dispatch does
    source = inspect.getsource(dispatch.dispatch_lazy_compute_data_proto)
    assert "worker_group._dispatch_info[mesh_name] = worker_group._query_dispatch_info(mesh_name)" in source
    assert "dp_size = max(dp_rank_mapping) + 1" in source


def test_verl_builds_the_tokenizer_before_the_datasets_and_the_workers_before_loading_a_checkpoint():
    setup = inspect.getsource(PPOTrainer._setup)
    # the chat-template check runs in _init_dataloader with the tokenizer _init_tokenizer made
    assert setup.index("self._init_tokenizer()") < setup.index("self._init_dataloader()")
    # tba.lr_schedule replaces the actor engine's scheduler in _load_checkpoint: the workers exist by then
    assert setup.index("self.actor_rollout_wg") < setup.index("self._load_checkpoint()")
    assert "self._setup()" in inspect.getsource(PPOTrainer.init)


def test_verl_attributes_tba_ext_reads_are_still_set():
    init = inspect.getsource(PPOTrainer.__init__) + inspect.getsource(PPOTrainer)
    for attribute in (
        "self.parameter_sync_step",
        "self.replay_buffer",
        "self.actor_rollout_wg",
        "self.ref_policy_wg",
        "self.use_reference_policy",
        "self.local_trigger_step",
        "self.global_steps",
    ):
        assert attribute in init, attribute
    assert "self.standalone_checkpoint_manager" in inspect.getsource(SeparateAsync)
    assert "logger" in vars(trainer_separate_async)  # tba-ext wraps it (verl logs with flush=True)
    for attribute in ("self.pending_keys", "self.running_keys", "self.partitions"):
        assert attribute in inspect.getsource(ReplayBufferAsync.__mro__[1]) + inspect.getsource(ReplayBufferAsync), (
            attribute
        )


def test_the_searchers_reference_log_probs_reach_the_replay_store():
    # verl's resume loop calls the plain client once per segment (tba-ext's client sees each segment there)
    assert "await super().generate(" in inspect.getsource(llm_server.FullyAsyncLLMServerClient.generate)
    # the agent loop keeps the server's extra_fields, and the TransferQueue row carries them whole
    from verl.experimental.agent_loop import single_turn_agent_loop
    from verl.trainer.ppo.v1 import agent_loop_tq

    assert "extra_fields=output.extra_fields" in inspect.getsource(single_turn_agent_loop.SingleTurnAgentLoop.run)
    assert "field = output.as_dict()" in inspect.getsource(agent_loop_tq)


def test_verls_gpu_rollout_servers_answer_the_liveness_probe_tba_ext_sends():
    """Searcher metrics on GPUs: verl's vLLM and SGLang servers have no counters (``stats``), so the trainer
    counts them alive by ``get_server_address`` (read from verl's source: importing them needs vLLM / SGLang)."""
    import re

    for module in (
        "verl.workers.rollout.vllm_rollout.vllm_async_server",
        "verl.workers.rollout.sglang_rollout.async_sglang_server",
    ):
        path = os.path.join(os.path.dirname(verl.__file__), *module.split(".")[1:]) + ".py"  # not imported
        source = open(path).read()
        assert re.search(r"\n    (async )?def get_server_address\(self", source), module
        assert not re.search(r"\n    (async )?def stats\(self", source), module
