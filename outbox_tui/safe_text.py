"""Stored text on screen: shown as characters, never acted on by the terminal."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and C1: what a terminal acts on instead of showing.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters spelled out (``\\x1b``): an error message or id
    stored in a row (an outside system's text, say) cannot move the cursor, retitle the
    window or recolour the operator's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
