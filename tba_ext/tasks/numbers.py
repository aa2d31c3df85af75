"""Reading numbers out of responses: the rules the arithmetic and GSM8K rewards share."""

from __future__ import annotations

import math
import re

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
