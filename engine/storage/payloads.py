"""Reading stored text: strict JSON payloads, and error text cut to what a column keeps."""

from __future__ import annotations

import json
from typing import Any

ERROR_LIMIT = 4000

# Why a payload that is valid JSON cannot be decoded: it nests deeper than the recursion
# limit lets json's decoder go (a RecursionError, not a ValueError). SQLite's JSON check
# allows 1,000 levels and PostgreSQL's jsonb more, so such a row can be stored.
PAYLOAD_TOO_DEEP = "nested too deeply to decode"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Strict: Python's decoder takes NaN and Infinity, which no JSON parser does. A payload
# holding them is corrupt, not relayed as a body consumers cannot parse.
_DECODER = json.JSONDecoder(parse_constant=_not_json)
# The C scanner json.loads ends in, called directly on the hot path (decision 0025).
_SCAN = getattr(_DECODER, "scan_once", None)


def decode_json(text: str) -> Any:
    """``json.loads(text)``, by the scanner alone when the text is one bare JSON value.

    Anything else (white space around it, trailing data, an error) goes to
    ``json.loads``, so what is accepted and every error message stay its own.
    """
    if _SCAN is not None:
        try:
            value, end = _SCAN(text, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text, parse_constant=_not_json)


def decode_stored(raw: Any) -> Any:
    """A payload as the driver returned it (text, bytes or already decoded), decoded."""
    if type(raw) is str:
        return decode_json(raw)
    if isinstance(raw, str | bytes):
        return json.loads(raw, parse_constant=_not_json)
    return raw


def truncate_error(message: str) -> str:
    """``message`` cut to what the error columns keep."""
    return message if len(message) <= ERROR_LIMIT else message[: ERROR_LIMIT - 1] + "…"
