"""verl's trajectory rows <-> the replay store's compact form.

A row written by verl's V1 agent loop (``agent_loop_tq._agent_loop_postprocess``) is the prompt's dataset
fields, the ``AgentLoopOutput`` of one sample and what verl derives from them. The store keeps:
- per prompt, once: the dataset fields and the prompt tokens;
- per trajectory: response tokens (int32), the searcher's log-probs (float32), the reward, and the remaining
  small per-sample fields packed to bytes (``tba_ext.core.sealed.pack``: msgpack, data only, never a pickle).
Fields verl derives (``input_ids``, ``position_ids``, ``loss_mask``, the ``rm_scores`` vector, an all-ones
``response_mask``, the length tags) are rebuilt exactly as verl builds them; a row where one of them is not
the standard derivation (multi-modal position ids, tool-masked responses, ...) keeps its own copy.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from tba_ext.core.sealed import pack, unpack
from tba_ext.core.wire import SEARCHER_REFERENCE

# per-sample fields: AgentLoopOutput's (under the names ``as_dict`` gives them) and what verl adds per sample
_RENAMED = {
    "prompt_ids": "prompts",
    "response_ids": "responses",
    "response_logprobs": "rollout_log_probs",
    "reward_score": "rm_scores",
}
PER_SAMPLE = ({_RENAMED.get(name, name) for name in AgentLoopOutput.model_fields} - {"prompts"}) | {
    "session_id",
    "loss_mask",
    "input_ids",
    "position_ids",
    "attention_mask",
    "multi_modal_inputs",
}
_DERIVED_TAGS = ("status", "prompt_len", "response_len", "seq_len")
# per-sample fields verl derives, in the order of the bit that says a row had them in the standard form
_DERIVED = ("response_mask", "rm_scores", "input_ids", "position_ids", "attention_mask", "loss_mask")


def pop_searcher_reference(row: dict) -> np.ndarray | None:
    """The searcher's reference log-probs of this row's response, taken out of its ``extra_fields``."""
    extra = row.get("extra_fields")
    if not isinstance(extra, dict) or SEARCHER_REFERENCE not in extra:
        return None
    extra = dict(extra)
    values = extra.pop(SEARCHER_REFERENCE)
    row["extra_fields"] = extra
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float32)
    if values.shape != as_numpy(row["responses"]).shape:
        raise ValueError(
            f"{SEARCHER_REFERENCE}: {values.shape[0]} log-probs for a response of "
            f"{as_numpy(row['responses']).shape[0]} tokens"
        )
    return values


def as_numpy(value) -> np.ndarray:
    """A row field (a tensor, or what TransferQueue returns for it) as a numpy array."""
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def split_row(row: dict, tag: dict) -> tuple[bytes, np.ndarray, np.ndarray | None, float, bytes]:
    """A verl row and its tag -> (packed prompt fields, response int32, rollout log-probs float32 or None,
    reward, packed per-sample extras)."""
    prompts, responses = as_numpy(row["prompts"]), as_numpy(row["responses"])
    if responses.size and (responses.max() >= 2**31 or responses.min() < 0):
        raise ValueError("response token ids do not fit int32")
    rm_scores = as_numpy(row["rm_scores"]).astype(np.float32)
    reward = float(rm_scores.sum(dtype=np.float64))
    mask = as_numpy(row["response_mask"])
    length = prompts.size + responses.size
    standard = {
        "input_ids": lambda v: np.array_equal(as_numpy(v), np.concatenate([prompts, responses])),
        "position_ids": lambda v: np.array_equal(as_numpy(v), np.arange(length)),
        "attention_mask": lambda v: bool((as_numpy(v) == 1).all()),
        "loss_mask": lambda v: np.array_equal(as_numpy(v), mask),
        "response_mask": lambda v: bool((as_numpy(v) == 1).all()),
        "rm_scores": lambda v: responses.size > 0 and not rm_scores[:-1].any() and rm_scores[-1] == np.float32(reward),
    }
    prompt_fields, extras, derived = {"prompts": prompts.astype(np.int32)}, {}, []
    for key, value in row.items():
        if key in ("prompts", "responses", "rollout_log_probs", "uid"):
            continue
        if key not in PER_SAMPLE:
            prompt_fields[key] = value
        elif key in standard and standard[key](value):
            derived.append(key)
        else:
            extras[key] = value
    extras["__derived__"] = sum(1 << _DERIVED.index(key) for key in derived)
    tags = {k: v for k, v in tag.items() if k not in _DERIVED_TAGS or tag.get("status") != "success"}
    extras["__tag__"] = tags
    logprobs = row.get("rollout_log_probs")
    logprobs = None if logprobs is None else as_numpy(logprobs).astype(np.float32)
    return (_dumps(prompt_fields), responses.astype(np.int32), logprobs, reward, _dumps(extras))


def _dumps(fields: dict) -> bytes:
    try:
        return zlib.compress(pack(fields), 1)
    except TypeError as exc:  # a field of a type tba-ext cannot store without pickle
        names = ", ".join(sorted(map(str, fields)))
        raise TypeError(f"a verl row field cannot enter the replay store ({exc}); the fields: {names}") from exc


def _loads(packed: bytes) -> dict:
    return unpack(zlib.decompress(packed))


def load_prompt(packed: bytes) -> dict:
    """The prompt fields ``split_row`` packed (once per group when replaying)."""
    fields = _loads(packed)
    fields["prompts"] = torch.from_numpy(fields["prompts"].astype(np.int64))
    return fields


def build_row(
    prompt_fields: dict, response: np.ndarray, logprobs: np.ndarray | None, reward: float, extras: bytes, uid: str
) -> tuple[dict, dict]:
    """The inverse of ``split_row`` (with ``prompt_fields`` from ``load_prompt``): a verl row under a new
    ``uid``, and its tag."""
    extras = _loads(extras)
    tag, derived = extras.pop("__tag__"), extras.pop("__derived__")
    prompts = prompt_fields["prompts"]
    responses = torch.from_numpy(response.astype(np.int64))
    row = dict(prompt_fields, responses=responses, uid=uid, **extras)
    if logprobs is not None:
        row["rollout_log_probs"] = torch.from_numpy(logprobs.copy())
    input_ids = torch.cat([prompts, responses])
    rebuild = {
        "response_mask": lambda: torch.ones_like(responses),
        "rm_scores": lambda: torch.cat([torch.zeros(len(response) - 1), torch.tensor([reward])]).float(),
        "input_ids": lambda: input_ids,
        "position_ids": lambda: torch.arange(len(input_ids)),
        "attention_mask": lambda: torch.ones_like(input_ids),
        "loss_mask": lambda: row["response_mask"],
    }
    for i, key in enumerate(_DERIVED):  # in _DERIVED's order: loss_mask, last, copies response_mask
        if derived >> i & 1:
            row[key] = rebuild[key]()
    if "status" not in tag:
        tag = {
            "status": "success",
            "prompt_len": len(prompts),
            "response_len": len(response),
            "seq_len": len(prompts) + len(response),
            **tag,
        }
    return row, tag
