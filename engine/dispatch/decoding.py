"""Turning claimed rows into envelopes, and setting apart the rows that cannot be delivered.

A row is delivered only if it decodes, matches its registered schema and tenant, and has
attempts left. Every claimed row passes through here, so the common case takes a short
path (``_clean_envelope``); anything unusual takes the long one (``_decode``), which
says what is wrong.
"""

from __future__ import annotations

import dataclasses

from engine.dispatch.claimed import Batch, ClaimedRow, Outcome
from engine.errors import EventValidationError
from engine.storage.payloads import PAYLOAD_TOO_DEEP, decode_json
from engine.writing.envelope import EventEnvelope, attach_raw_payload, delivered_envelope
from engine.writing.registry import EventRegistry


class Decoder:
    """Decodes claimed rows against ``registry``, under the attempt budget in force.

    ``max_attempts``, when given, overrides every row's own budget.
    """

    def __init__(self, registry: EventRegistry, max_attempts: int | None) -> None:
        self.registry = registry
        self.max_attempts = max_attempts

    def budget(self, row: ClaimedRow) -> int:
        """The row's attempt budget, unless this dispatcher overrides every row's."""
        return self.budget_of(row.max_attempts)

    def budget_of(self, stored: int) -> int:
        """The attempt budget of a row whose ``max_attempts`` column holds ``stored``."""
        return self.max_attempts if self.max_attempts is not None else stored

    def decode_into(self, batch: Batch) -> None:
        """Sort the batch's rows into envelopes to deliver and outcomes to write at once."""
        for row in batch.rows:
            clean = self._clean_envelope(row)
            if clean is not None:
                batch.envelopes[clean.event_id] = clean
                continue
            envelope, problem = self._decode(row)
            if envelope is None and problem.startswith("corrupt row"):
                batch.undeliverable.append(Outcome(row, "dead_letter", problem, problem))
            elif envelope is None:
                batch.undeliverable.append(
                    Outcome(row, "dead_letter", problem, f"permanent: {problem}")
                )
            elif row.attempt_count > self.budget(row):
                why = (
                    f"attempts exhausted ({row.attempt_count - 1}/{self.budget(row)}); the last "
                    "lease expired before completion (dispatcher crash or handler over the lease)"
                )
                batch.undeliverable.append(Outcome(row, "dead_letter", why, why))
            else:
                batch.envelopes[row.event_id] = envelope

    def _clean_envelope(self, row: ClaimedRow) -> EventEnvelope | None:
        """The row's envelope if nothing about it needs a closer look; None: ask ``_decode``.

        It checks what ``_decode`` and the attempt budget check, reading every column
        once and building no error (decision 0025).
        """
        values = row.values
        event_id, tenant_id, event_type = values["id"], values["tenant_id"], values["event_type"]
        version, attempts, max_attempts = (
            values["event_version"],
            values["attempt_count"],
            values["max_attempts"],
        )
        replays, raw = values["replay_count"], row.raw_payload
        aggregate_type, aggregate_id = values["aggregate_type"], values["aggregate_id"]
        created_at = values["created_at"]
        budget = self.budget_of(max_attempts)  # the budget this dispatcher applies
        if not (
            type(event_id) is str
            and type(tenant_id) is str
            and type(event_type) is str
            and type(version) is int
            and type(attempts) is int
            and type(max_attempts) is int
            and type(replays) is int
            and type(aggregate_type) is str
            and type(aggregate_id) is str
            and created_at is not None
            and type(raw) is str
            and max_attempts >= 1
            and attempts <= budget
        ):
            return None
        try:
            payload = decode_json(raw)
        except (ValueError, RecursionError):
            return None
        if not self.registry.conforms(event_type, version, payload, tenant_id):
            return None
        claim_version = int(values["claim_version"])
        return delivered_envelope(
            event_id,
            tenant_id,
            event_type,
            version,
            aggregate_type,
            aggregate_id,
            payload,
            created_at,
            attempts,
            budget,
            claim_version,
            replays,
            raw,
            values["causation_id"],
            values["correlation_id"],
            values["ordering_key"],
            values["traceparent"],
            values["tracestate"],
        )

    def _decode(self, row: ClaimedRow) -> tuple[EventEnvelope | None, str]:
        """The row's envelope, or None and what makes it undeliverable."""
        values = row.values
        corrupt = row.problem()
        if corrupt is not None:
            return None, corrupt
        try:
            payload = row.decoded_payload()
        except ValueError as exc:
            return None, f"corrupt payload: not valid JSON ({exc})"
        except RecursionError as exc:  # valid JSON, deeper than Python's decoder goes
            return None, f"corrupt payload: {PAYLOAD_TOO_DEEP} ({exc})"
        try:
            self.registry.validate_event(
                values["event_type"], int(values["event_version"]), payload, values["tenant_id"]
            )
        except EventValidationError as exc:
            return None, f"schema: {exc}"
        envelope = EventEnvelope.from_row(values, payload)
        budget = self.budget_of(envelope.max_attempts)
        if budget != envelope.max_attempts:  # the budget this dispatcher applies
            envelope = dataclasses.replace(envelope, max_attempts=budget)
        if type(row.raw_payload) is str:  # the relay sends the text as stored
            attach_raw_payload(envelope, row.raw_payload)
        return envelope, ""
