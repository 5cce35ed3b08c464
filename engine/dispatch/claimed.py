"""What a claim hands over: the rows a dispatcher holds, a decoded batch, and outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from engine.handlers.idempotency import HandlerRunRecord
from engine.storage.payloads import decode_stored
from engine.writing.envelope import EventEnvelope
from engine.writing.registry import RegisteredHandler


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A row this dispatcher holds: its columns and the fencing token it was claimed with."""

    values: Mapping[Any, Any]  # the result row's own mapping, keyed by column name
    raw_payload: Any

    @property
    def event_id(self) -> str:
        return str(self.values["id"])

    @property
    def seq(self) -> int:
        """Its write order; 0 for a SQLite row whose ``seq`` was nulled by hand (the column
        is nullable there, its trigger fills it), so one such row cannot stop every claim
        that takes it. PostgreSQL's identity column cannot be null."""
        seq = self.values["seq"]
        return seq if type(seq) is int else 0 if seq is None else int(seq)

    @property
    def ordering_key(self) -> str | None:
        key = self.values["ordering_key"]
        return None if key is None else str(key)

    @property
    def claim_version(self) -> int:
        return int(self.values["claim_version"])

    @property
    def attempt_count(self) -> int:
        return int(self.values["attempt_count"])

    @property
    def max_attempts(self) -> int:
        return int(self.values["max_attempts"])

    @property
    def event_type(self) -> str:
        return str(self.values["event_type"])

    @property
    def tenant_id(self) -> str:
        return str(self.values["tenant_id"])

    def problem(self) -> str | None:
        """What makes this row undeliverable as stored, naming the column; None if nothing.

        PostgreSQL's column types refuse such rows at INSERT, and so do the CHECKs of
        SQLite tables this version made; an older SQLite table takes anything. A row is
        judged on its own, so one bad row never breaks the batch it was claimed with.
        """
        values = self.values
        # The common case in one expression; the loops below name the bad column.
        if (
            type(values["event_version"]) is int
            and type(values["attempt_count"]) is int
            and type(values["replay_count"]) is int
            and type(max_attempts := values["max_attempts"]) is int
            and max_attempts >= 1
            and values["created_at"] is not None
            and type(values["tenant_id"]) is str
            and type(values["event_type"]) is str
            and type(values["aggregate_type"]) is str
            and type(values["aggregate_id"]) is str
        ):
            return None
        for name in ("event_version", "max_attempts", "attempt_count", "replay_count"):
            if type(values[name]) is not int:
                return f"corrupt row: column {name} is {values[name]!r}, not an integer"
        if values["max_attempts"] < 1:
            return (
                f"corrupt row: column max_attempts is {values['max_attempts']}, must be at least 1"
            )
        if values["created_at"] is None:
            return "corrupt row: column created_at is not a timestamp"
        for name in ("tenant_id", "event_type", "aggregate_type", "aggregate_id"):
            if not isinstance(values[name], str):
                return f"corrupt row: column {name} is {values[name]!r}, not text"
        return None

    def decoded_payload(self) -> Any:
        """The payload, decoded here so one corrupt row cannot break a whole batch."""
        return decode_stored(self.raw_payload)


# "completed": published by a transactional handler's own transaction (nothing left to
# write); "lost": that transaction found the claim gone and rolled back.
OutcomeKind = Literal["published", "completed", "failed", "dead_letter", "unattempted", "lost"]


@dataclass(slots=True)  # not frozen: one per event, and a frozen field costs more to set
class Outcome:
    """What became of one claimed row, and the handler runs behind it.

    ``runs`` are the run records of a delivery that did not end published (the
    handlers that succeeded before one failed, and the failure). A published one
    carries ``ran``, its event type's handlers, and no records: its row is the record.
    Only if the completion's fence refuses it are their successes written, so the
    dispatcher that took the row over skips them.
    """

    row: ClaimedRow
    kind: OutcomeKind
    error: str | None = None
    reason: str | None = None
    runs: list[HandlerRunRecord] | None = None
    ran: tuple[RegisteredHandler, ...] = ()
    away: bool = False  # failed because the external publisher's broker was away


@dataclass(slots=True)
class Batch:
    """A claimed batch, decoded: deliverable envelopes by id, and the rows set apart."""

    claimed_at: datetime
    rows: list[ClaimedRow]
    envelopes: dict[str, EventEnvelope] = field(default_factory=dict)
    undeliverable: list[Outcome] = field(default_factory=list)

    def deliverable(self) -> list[ClaimedRow]:
        """The rows to deliver, in claim order."""
        return [r for r in self.rows if r.event_id in self.envelopes]

    def without(self, gone: set[str]) -> Batch:
        """This batch less the rows whose ids are in ``gone``."""
        kept = Batch(self.claimed_at, [r for r in self.rows if r.event_id not in gone])
        kept.envelopes = {i: e for i, e in self.envelopes.items() if i not in gone}
        kept.undeliverable = [o for o in self.undeliverable if o.row.event_id not in gone]
        return kept
