"""Reading the guarded external calls back from effects_app's log.

A call is one ``effect`` line; it is *recorded* once a ``recorded`` line of the same call
and process follows. A call made again (a second ``effect`` line of one event and effect
key) is a *repeat*. A repeat is *after a kill* when the earlier call's process was killed
after that call and before its record committed (the window); any other repeat happened
with no kill to explain it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EffectCalls:
    """What the log says about the guarded calls."""

    calls: int = 0
    windows_ms: list[float] = field(default_factory=list)  # call -> record committed
    repeats_after_kill: Counter[str] = field(default_factory=Counter)  # per killed pid
    repeats_without_kill: list[str] = field(default_factory=list)  # "<call> in <pid>"
    called: set[str] = field(default_factory=set)  # "<event id>/<effect key>"

    @property
    def repeats(self) -> int:
        return sum(self.repeats_after_kill.values()) + len(self.repeats_without_kill)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.windows_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        if not self.windows_ms:
            return "no call recorded"
        return (
            f"p50 {self.percentile(0.5):.1f} ms, p99 {self.percentile(0.99):.1f} ms, "
            f"max {max(self.windows_ms):.1f} ms over {len(self.windows_ms):,} calls"
        )


def read_effect_calls(log: Path, killed_at: Mapping[str, int]) -> EffectCalls:
    """Parse the log; ``killed_at`` maps a SIGKILLed pid to the monotonic ns it was gone."""
    result = EffectCalls()
    open_calls: dict[tuple[str, str], int] = {}  # (call, pid) -> ns of the call
    history: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)  # pid, ns, recorded
    for line in log.read_text().splitlines():
        kind, call, pid, ns = line.split()
        if kind == "effect":
            result.calls += 1
            result.called.add(call)
            open_calls[(call, pid)] = int(ns)
            history[call].append((pid, int(ns), False))
        elif kind == "recorded" and (call, pid) in open_calls:  # not an answer from a record
            called_ns = open_calls.pop((call, pid))
            result.windows_ms.append((int(ns) - called_ns) / 1e6)
            history[call] = [(p, n, r or (p, n) == (pid, called_ns)) for p, n, r in history[call]]
    for call, made in history.items():
        for pid, ns, recorded in made[:-1]:  # every call but the last was made again
            if not recorded and pid in killed_at and killed_at[pid] > ns:
                result.repeats_after_kill[pid] += 1
            else:
                result.repeats_without_kill.append(f"{call} in {pid}")
    return result
