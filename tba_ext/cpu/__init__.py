"""CPU runtime for verl 0.9.1: platform, gloo/pinned-memory fixes, transformers rollout backend.

Active only where there is no GPU (``runtime.cpu_runtime_active``); on GPU machines verl's own
platforms and vLLM/SGLang backends are used unchanged.
"""
