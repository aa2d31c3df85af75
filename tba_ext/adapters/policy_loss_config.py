"""Typed hyperparameters of the tb / tb_pg losses, selected with ``policy_loss._target_``.

verl rejects unknown keys under ``actor_rollout_ref.actor.policy_loss``; swapping the dataclass through
``_target_`` (``core.settings.POLICY_LOSS_CONFIG_TARGET``, this class's import path) is verl's own way to add
fields (docs/algorithm.md).
"""

from dataclasses import dataclass

from verl.workers.config.actor import PolicyLossConfig

from tba_ext.core.settings import IS_RATIO_MAX, checked_is_ratio_max


@dataclass
class TBPolicyLossConfig(PolicyLossConfig):
    """Policy-loss config with TB fields.

    Args:
        loss_scale: multiplies the TB loss. TB residuals are O(r / beta) (250 at beta = 0.004), so the raw
            gradient norm is large and verl's ``actor.grad_clip`` (default 1.0) clips almost every step;
            Adam is invariant to a constant scale, so clipping only changes relative step sizes. Lower it
            (e.g. to beta^2) to keep gradients under the clip threshold instead.
        is_ratio_max: upper clamp of the detached importance ratio in ``tb_pg`` (CISPO-style, default 8).
    """

    loss_scale: float = 1.0
    is_ratio_max: float = IS_RATIO_MAX

    def __post_init__(self):
        if not self.loss_scale > 0:
            raise ValueError(f"actor_rollout_ref.actor.policy_loss.loss_scale must be > 0, got {self.loss_scale}")
        checked_is_ratio_max(self.is_ratio_max)
