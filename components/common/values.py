"""Values as the project checks and shows them: an interval written as in mathematics, a value shortened for an
error line."""

from __future__ import annotations

import argparse
import re
from typing import Any

SHOWN_CHARACTERS = 80

_INTERVAL = re.compile(r"([\[(])\s*(-?inf|[-+0-9.e]+)\s*,\s*(-?inf|[-+0-9.e]+)\s*([\])])")


def in_interval(value: float, interval: str) -> bool:
    """Whether `value` lies in `interval`, written as in mathematics: "[0, 1)", "(0, inf)", "[1, 4096]"."""
    match = _INTERVAL.fullmatch(interval)
    if match is None:
        raise ValueError(f"range {interval!r} is not an interval such as [0, 1)")
    opening, low, high, closing = match.groups()
    low_value, high_value = float(low), float(high)
    above = value >= low_value if opening == "[" else value > low_value
    below = value <= high_value if closing == "]" else value < high_value
    return above and below


def shown(value: Any, limit: int = SHOWN_CHARACTERS) -> str:
    """A value as an error line shows it: its repr, at most `limit` characters (a 2,000,000-character value is not
    echoed whole), never a line break."""
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text):,} characters)"


def parse_bool(text: str) -> bool:
    """The project's one reading of a boolean written as text (command lines, make variables)."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
