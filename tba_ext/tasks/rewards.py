"""Reward functions in verl's ``custom_reward_function`` convention: compute_score(data_source, solution_str,
ground_truth, extra_info) -> float. Select with reward.custom_reward_function.path=pkg://tba_ext.tasks.rewards
and .name=compute_score.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The reference TBA code's rule: the last number in the response, commas removed."""
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def numbers_equal(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    try:
        return math.isclose(float(pred), float(str(gold).replace(",", "")), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return False


def arith_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response is exactly the number (after stripping), 0.0 otherwise."""
    pred = solution_str.replace("<|im_end|>", "").strip()
    return 1.0 if _NUMBER.fullmatch(pred) and numbers_equal(pred, ground_truth) else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if data_source == "tba_ext/arith":
        return arith_score(solution_str, ground_truth)
    if data_source in ("openai/gsm8k", "tba_ext/gsm8k", "tba_ext/gsm_symbolic"):
        from tba_ext.tasks.gsm8k import gsm8k_score

        return gsm8k_score(solution_str, ground_truth, rule=(extra_info or {}).get("grading", "math_verify"))
    raise ValueError(f"tba-ext has no reward for data_source {data_source!r}")
