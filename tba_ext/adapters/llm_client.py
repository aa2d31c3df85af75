"""verl's resuming rollout client, keeping the searcher's reference log-probs of every response.

verl's ``separate_async`` and ``colocate_async`` trainers generate through ``FullyAsyncLLMServerClient``, which
resumes a request aborted by a weight sync and rebuilds the output from its segments, keeping only the weight
versions of ``extra_fields``. This client also concatenates the segments' ``rows.SEARCHER_REFERENCE`` (each
segment's reference log-probs are conditioned on the prompt and the segments before it, so the concatenation is
the whole response's); if a segment came without them, the response has none and the trainer computes them.
The tba_* trainer modes hand it to verl through ``get_llm_client``, the trainer's own extension point.
"""

from __future__ import annotations

import contextvars

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from tba_ext.core.wire import SEARCHER_REFERENCE

# the segments of the request being generated in this asyncio task: each one's reference log-probs or None
_SEGMENTS: contextvars.ContextVar[list | None] = contextvars.ContextVar("tba_reference_segments", default=None)


class _SegmentReferences(LLMServerClient):
    """Below verl's resume loop in the method order: sees each segment's server output."""

    async def generate(self, *args, **kwargs):
        output = await super().generate(*args, **kwargs)
        segments = _SEGMENTS.get()
        if segments is not None:
            segments.append((len(output.token_ids), output.extra_fields.get(SEARCHER_REFERENCE)))
        return output


class ReferenceKeepingClient(FullyAsyncLLMServerClient, _SegmentReferences):
    async def generate(self, *args, **kwargs):
        segments: list = []
        token = _SEGMENTS.set(segments)
        try:
            output = await super().generate(*args, **kwargs)
        finally:
            _SEGMENTS.reset(token)
        if segments and all(ref is not None and len(ref) == n for n, ref in segments):
            values = [value for _, ref in segments for value in ref]
            if len(values) == len(output.token_ids):
                output.extra_fields[SEARCHER_REFERENCE] = values
        return output
