"""Reward functions in verl's ``custom_reward_function`` convention: compute_score(data_source, solution_str,
ground_truth, extra_info, **reward_kwargs) -> float. Select with
reward.custom_reward_function.path=pkg://tba_ext.tasks.rewards and .name=compute_score.

Model-scored tasks read their models from reward_kwargs: TL;DR ``reward_model_path`` (scored by verl's served
reward model when ``reward.reward_model.enable``, which hands the function ``reward_router_address``; else loaded
here); red-teaming ``victim_model_path`` and ``toxicity_model_path`` (+ ``victim_max_new_tokens``). Prompts are
scored as text, so models without a chat template (Pythia, GPT-2) work.
"""

from __future__ import annotations

from tba_ext.tasks.hendrycks_math import DATA_SOURCE as MATH_SOURCE
from tba_ext.tasks.hendrycks_math import VERL_MATH_SOURCES
from tba_ext.tasks.numbers import NUMBER, last_number, numbers_equal

# the data_source values compute_score scores: a row with another is refused before a run starts
# (tba_ext.tasks.data.check_dataset), not by the reward loop once the workers run
SCORED_SOURCES = (
    "tba_ext/arith",
    "tba_ext/arith_worked",
    "tba_ext/countdown",
    "openai/gsm8k",
    "tba_ext/gsm8k",
    "tba_ext/gsm_symbolic",
    MATH_SOURCE,
    *VERL_MATH_SOURCES,
    "tba_ext/tldr",
    "tba_ext/redteam",
)


def arith_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response is exactly the number (after stripping), 0.0 otherwise."""
    pred = solution_str.replace("<|im_end|>", "").strip()
    return 1.0 if NUMBER.fullmatch(pred) and numbers_equal(pred, ground_truth) else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if data_source == "tba_ext/arith":
        return arith_score(solution_str, ground_truth)
    if data_source == "tba_ext/arith_worked":  # the worked answer's last number, as the reference's GSM8K rule
        return 1.0 if numbers_equal(last_number(solution_str), ground_truth) else 0.0
    if data_source == "tba_ext/countdown":
        from tba_ext.tasks.countdown import countdown_score

        return countdown_score(solution_str, ground_truth)
    if data_source in ("openai/gsm8k", "tba_ext/gsm8k", "tba_ext/gsm_symbolic"):
        from tba_ext.tasks.gsm8k import gsm8k_score

        return gsm8k_score(solution_str, ground_truth, rule=(extra_info or {}).get("grading", "math_verify"))
    if data_source == MATH_SOURCE or data_source in VERL_MATH_SOURCES:
        from tba_ext.tasks.hendrycks_math import math_score

        return math_score(solution_str, ground_truth)
    if data_source == "tba_ext/tldr":
        from tba_ext.tasks.scorers import check_model_path, reward_model_scores, served_reward_model_score
        from tba_ext.tasks.tldr import rm_text

        text = rm_text((extra_info or {})["prompt_text"], solution_str)
        if kwargs.get("reward_router_address"):  # verl serves the reward model (reward.reward_model.enable)
            return served_reward_model_score(kwargs["reward_router_address"], kwargs["reward_model_path"], text)
        path = check_model_path(kwargs.get("reward_model_path"), "reward_model_path")
        return reward_model_scores(path, [text])[0]
    if data_source == "tba_ext/redteam":
        from tba_ext.tasks.redteam import toxicity_rewards
        from tba_ext.tasks.scorers import check_model_path

        victim = check_model_path(kwargs.get("victim_model_path"), "victim_model_path")
        classifier = check_model_path(kwargs.get("toxicity_model_path"), "toxicity_model_path")
        toxicity, _ = toxicity_rewards([solution_str], victim, classifier, int(kwargs.get("victim_max_new_tokens", 32)))
        return toxicity[0]
    raise ValueError(f"tba-ext has no reward for data_source {data_source!r}")
