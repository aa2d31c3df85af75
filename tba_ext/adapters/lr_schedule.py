"""``tba.lr_schedule``: the paper's warmup-stable-decay learning rate in verl's FSDP actor.

verl 0.9.1's FSDP engine builds a constant or cosine scheduler only. This replaces the actor engine's scheduler,
inside each actor worker and before verl loads a checkpoint (``TBATrainerMixin._load_checkpoint``), by a
``LambdaLR`` on the same optimizer whose factor is ``tba_ext.core.tb.wsd_lr_ratio`` of the optimizer updates
done; verl's checkpoint manager saves and restores it as it would its own. verl steps it once per
``update_actor`` call (``core.steps.scheduler_updates_per_call`` updates each), so every update of one call
shares a learning rate, as with verl's own schedules.
"""

from __future__ import annotations

from torch.optim.lr_scheduler import LambdaLR

from tba_ext.core.settings import LRSchedule
from tba_ext.core.tb import wsd_lr_ratio


def install_lr_schedule(worker, schedule: dict, updates_per_call: int) -> float:
    """Runs inside an actor worker (``__ray_call__``); returns the learning rate the first update will use."""
    spec = LRSchedule(**schedule)
    for candidate in (worker, *getattr(worker, "worker_dict", {}).values()):
        engine = getattr(getattr(candidate, "actor", None), "engine", None)
        if engine is None or getattr(engine, "optimizer", None) is None:
            continue

        def factor(calls: int) -> float:
            return wsd_lr_ratio(
                calls * updates_per_call,
                spec.warmup_updates,
                spec.stable_updates,
                spec.decay_updates,
                spec.min_lr_ratio,
                spec.decay_shape,
            )

        engine.lr_scheduler = LambdaLR(engine.optimizer, factor)
        if getattr(engine, "checkpoint_manager", None) is not None:
            engine.checkpoint_manager.lr_scheduler = engine.lr_scheduler
        return engine.optimizer.param_groups[0]["lr"]
    raise RuntimeError("tba.lr_schedule: no verl actor engine with an optimizer in this worker")
