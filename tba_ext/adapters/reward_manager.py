"""``reward.reward_manager.name=tba_checked``: verl's naive reward manager with the result checked.

verl 0.9.1 passes whatever the reward function returns on into the advantage computation: a string fails
deep inside torch with no hint of which function or row produced it, and NaN silently poisons the batch.
Here a reward function that raises or returns a non-number stops the run with an error naming the function,
the data_source and the dataset row; NaN/inf is refused too, unless the TBA replay sampler is on, whose
store counts non-finite rewards, never samples them, and stops the run past ``max_nonfinite_frac``.
"""

from __future__ import annotations

import math
import numbers

from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

from tba_ext.adapters.checks import uses_replay_sampler

NAME = "tba_checked"


class RewardFunctionError(RuntimeError):
    pass


def _describe(config, item) -> str:
    fn = config.reward.get("custom_reward_function") or {}
    where = f"{fn.get('path')}:{fn.get('name')}" if fn.get("path") else "verl's default_compute_score"
    extra = item.non_tensor_batch.get("extra_info", {}) or {}
    return (
        f"reward function {where} (reward.custom_reward_function) on data_source="
        f"'{item.non_tensor_batch.get('data_source')}', {extra.get('split', '?')} row with "
        f"extra_info.index={extra.get('index', '?')}"
    )


def _replay_tolerates_nonfinite(config) -> bool:
    return uses_replay_sampler(config)


@register(NAME)
class CheckedRewardManager(NaiveRewardManager):
    async def run_single(self, data):
        item = data[-1:][0]
        try:
            result = await super().run_single(data)
        except Exception as exc:
            raise RewardFunctionError(f"{_describe(self.config, item)} raised {type(exc).__name__}: {exc}") from exc
        score = result["reward_score"]
        if isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise RewardFunctionError(
                f"{_describe(self.config, item)} returned {type(score).__name__} {score!r:.80}; it must return a "
                "number (or a dict whose 'score' is a number)"
            )
        score = float(score)
        if not math.isfinite(score) and not _replay_tolerates_nonfinite(self.config):
            raise RewardFunctionError(
                f"{_describe(self.config, item)} returned {score}; non-finite rewards are only tolerated with "
                "the TBA replay sampler (which counts and skips them)"
            )
        result["reward_score"] = score
        return result
