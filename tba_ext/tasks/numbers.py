"""Reading numbers and answers out of responses: the rules the arithmetic, GSM8K and MATH rewards share."""

from __future__ import annotations

import math
import re
import threading

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The reference TBA code's rule: the last number in the response, commas removed."""
    found = NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def numbers_equal(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    try:
        return math.isclose(float(pred), float(str(gold).replace(",", "")), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return False


def math_verify_equal(gold_text: str, answer_text: str) -> bool:
    """math-verify's parse of both texts, then its equivalence check. Its time limits use ``signal.alarm``, which
    works only in a process's main thread: verl's reward loop scores in worker threads (where math-verify would
    raise on every row), so there the limits are off."""
    from math_verify import parse, verify

    limit = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(gold_text, parsing_timeout=limit)
    answer = parse(answer_text, parsing_timeout=limit)
    return bool(gold and answer and verify(gold, answer, timeout_seconds=limit))
