"""``EventSchemaSpec``: a payload's required and optional fields with their JSON types.

The schema a registered event version is checked against when it is not a pydantic model
(engine.writing.models), at publish and before the handlers; and the context fields every
outbox payload carries, checked for every version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FieldType = type | tuple[type, ...]

CONTEXT_FIELDS: Mapping[str, FieldType] = {"tenant_id": str, "actor_id": str, "request_id": str}
OPTIONAL_CONTEXT_FIELDS: Mapping[str, FieldType] = {"trace_id": str}


def _type_name(expected: FieldType) -> str:
    if isinstance(expected, tuple):
        return " | ".join(t.__name__ for t in expected)
    return expected.__name__


def _matches(value: Any, expected: FieldType) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in types:
        return False  # bool is an int subclass; a flag is not a count
    if isinstance(value, int) and float in types and not isinstance(value, bool):
        return True
    return isinstance(value, types)


def _exact_types(expected: FieldType) -> frozenset[type]:
    """Value types that ``_matches`` accepts as they are (an int where a float may go)."""
    types = set(expected) if isinstance(expected, tuple) else {expected}
    if float in types:
        types.add(int)
    return frozenset(types)


@dataclass(frozen=True, slots=True)
class EventSchemaSpec:
    """Required and optional payload fields with their JSON types."""

    required: Mapping[str, FieldType] = field(default_factory=dict)
    optional: Mapping[str, FieldType] = field(default_factory=dict)
    # Per field, the exact value types that certainly match (what json.loads returns):
    # one set lookup per field on the hot path; anything else gets the full check.
    _exact: tuple[tuple[str, frozenset[type]], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        exact = [(name, _exact_types(t)) for name, t in self.required.items()]
        exact += [(name, _exact_types(t) | {type(None)}) for name, t in self.optional.items()]
        object.__setattr__(self, "_exact", tuple(exact))

    def conforms(self, payload: Mapping[str, Any]) -> bool:
        """True when ``payload`` certainly conforms (False: ask ``problems``)."""
        get = payload.get
        # A plain loop, not all(...): its generator costs more, on every delivery (decision 0025).
        for name, types in self._exact:  # noqa: SIM110
            if type(get(name)) not in types:
                return False
        return True

    def problems(self, payload: Mapping[str, Any]) -> list[str]:
        """Every way ``payload`` breaks this spec (empty when it conforms)."""
        found: list[str] = []
        for name, expected in self.required.items():
            if name not in payload or payload[name] is None:
                found.append(f"missing required field {name!r}")
            elif not _matches(payload[name], expected):
                found.append(
                    f"field {name!r} must be {_type_name(expected)}, "
                    f"got {type(payload[name]).__name__}"
                )
        for name, expected in self.optional.items():
            if payload.get(name) is not None and not _matches(payload[name], expected):
                found.append(
                    f"field {name!r} must be {_type_name(expected)}, "
                    f"got {type(payload[name]).__name__}"
                )
        return found
