"""How long a failed event waits before its next attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from engine.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Exponential (doubling, capped) or fixed delays, with jitter.

    ``delay(n)`` is the wait after the n-th failed attempt: ``base * 2**(n-1)``
    capped at ``max_seconds`` for exponential, ``base`` for fixed. ``jitter``
    (0..1) shortens each delay by a random fraction up to that share, which
    spreads retries of a burst of failures apart. The defaults are the settings'
    defaults too (``DispatcherSettings.backoff_*``), so a dispatcher built directly
    retries as one built from settings.
    """

    kind: Literal["exponential", "fixed"] = "exponential"
    base_seconds: float = 5.0
    max_seconds: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in ("exponential", "fixed"):
            raise ConfigurationError(
                f"backoff kind must be exponential or fixed, got {self.kind!r}"
            )
        if self.base_seconds < 0:
            raise ConfigurationError("backoff base_seconds must be >= 0")
        if self.max_seconds < self.base_seconds:
            raise ConfigurationError("backoff max_seconds must be >= base_seconds")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError("backoff jitter must be between 0 and 1")

    def delay(self, failed_attempts: int, rng: random.Random | None = None) -> timedelta:
        if failed_attempts < 1:
            failed_attempts = 1
        if self.kind == "fixed":
            seconds = self.base_seconds
        else:
            exponent = min(failed_attempts - 1, 62)
            seconds = min(self.max_seconds, self.base_seconds * (2**exponent))
        if self.jitter:
            seconds *= 1.0 - self.jitter * (rng or random).random()
        return timedelta(seconds=seconds)


#: The policy of a dispatcher given none, and the settings' defaults.
DEFAULT_BACKOFF = BackoffPolicy()
