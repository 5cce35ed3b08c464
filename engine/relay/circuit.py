"""The relay's circuit breaker: what it waits for while the broker is away, and when to probe.

Once a call found the broker away, the relay's ``ready()`` answers False until the next
probe is due, and the dispatcher claims nothing meanwhile: an outage spends at most the
attempts of the publishes it caught in flight (and never an event's last:
``ExternalPublishResult.unavailable``), and the backlog is not claimed and handed back
every round. A probe is a connect attempt, after ``probe_interval`` seconds, doubling
after each failed probe up to ``max_probe_interval``; the first probe that connects
closes the circuit. A broker under a resource alarm, or one that refuses every publish
(access refused, every queue full), accepts connections but takes no publish: each probe
then lets one call through, its interval grows as for a broker that is down, and only a
confirmed publish closes the circuit. Each outage is warned of once; ``waiting_since``
and ``waiting_reason`` say what the relay is waiting for (heartbeats carry them to
``stats`` and the console).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from engine.clock import utc_now
from engine.errors import ConfigurationError

UNAVAILABLE = "broker unavailable"


class Circuit:
    """The outage state of one relay; ``masked_url`` names the broker in its log lines."""

    def __init__(
        self,
        masked_url: str,
        *,
        probe_interval: float,
        max_probe_interval: float,
        log: logging.Logger,
    ) -> None:
        if not 0 <= probe_interval <= max_probe_interval:
            raise ConfigurationError("probe intervals must satisfy 0 <= probe <= max probe")
        self.masked_url = masked_url
        self.probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self._log = log
        self.waiting_reason: str | None = None  # set while the broker is known to be away
        # The broker, reachable, takes no publish: only a confirmed publish ends such an
        # outage, not a connect.
        self.refusing = False
        self.waiting_since: datetime | None = None
        self._probe_delay = probe_interval
        self._next_probe = 0.0  # time.monotonic() of the next probe while away

    @property
    def away(self) -> bool:
        return self.waiting_reason is not None

    def probe_due(self) -> bool:
        return time.monotonic() >= self._next_probe

    def probe_failed(self, reason: str) -> None:
        """A probe could not connect: wait longer before the next."""
        self._grow()
        self._next_probe = time.monotonic() + self._probe_delay
        self.waiting_reason = f"{UNAVAILABLE}: {reason}"
        self._log.debug("probe failed; next probe in %.3g s: %s", self._probe_delay, reason)

    def connected(self) -> None:
        """A new connection: the outage is over, unless connecting was never the trouble."""
        if self.refusing:
            self._log.debug(
                "connected to RabbitMQ at %s again; it took no publish last", self.masked_url
            )
        elif self.away:
            self.end()
        else:
            self._log.debug("connected to RabbitMQ at %s", self.masked_url)

    def published(self) -> None:
        """A call's publishes were confirmed: a broker that refused them takes them again."""
        if self.refusing:
            self.end()

    def end(self) -> None:
        self._log.info("RabbitMQ at %s is back; publishing again", self.masked_url)
        self.waiting_reason, self.refusing = None, False
        self.waiting_since = None
        self._probe_delay = self.probe_interval

    def report(self, error: str, failed: int, left: int, refused: bool = False) -> None:
        """An outage struck a call: warn once per outage (the dispatcher may retry every
        second), then DEBUG, and schedule the next probe.

        A refusal recurs at each probe, as every probe connects: the interval grows as for
        a broker that cannot be reached.
        """
        level = logging.DEBUG if self.away else logging.WARNING
        if not self.away:
            self.waiting_since = utc_now()
        elif refused and self.refusing:
            self._grow()
        self.waiting_reason, self.refusing = error, refused
        self._next_probe = time.monotonic() + self._probe_delay
        self._log.log(
            level,
            "%s; %d event(s) failed (retried with backoff), %d handed back unattempted "
            "(no attempt spent)",
            error,
            failed,
            left,
        )

    def _grow(self) -> None:
        self._probe_delay = min(
            max(self._probe_delay * 2, self.probe_interval), self.max_probe_interval
        )
