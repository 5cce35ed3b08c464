"""What one ``run_dispatcher`` call did: the totals its callers report and heartbeats carry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.dispatch import DispatchResult


@dataclass(slots=True)
class RunSummary:
    """Cumulative totals of one ``run_dispatcher`` call.

    ``idle_waits`` counts idle sleeps begun, ``wakeups`` those a notification
    cut short; ``last_error`` is the last storage error's one-line message.
    """

    iterations: int = 0
    claimed: int = 0
    published: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost_leases: int = 0
    purged: int = 0
    storage_errors: int = 0
    shutdown_requested: bool = False
    idle_waits: int = 0
    wakeups: int = 0
    last_error: str | None = None

    def add(self, result: DispatchResult) -> None:
        self.claimed += result.claimed
        self.published += result.published
        self.failed += result.failed
        self.dead_lettered += result.dead_lettered
        self.lost_leases += result.lost_leases

    def totals(self) -> dict[str, int]:
        return {
            "claimed": self.claimed,
            "published": self.published,
            "failed": self.failed,
            "dead_lettered": self.dead_lettered,
            "lost_leases": self.lost_leases,
            "purged": self.purged,
            "storage_errors": self.storage_errors,
        }

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
