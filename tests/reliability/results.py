"""One record per scenario and database: the figures docs/RELIABILITY.md reports.

A scenario asserts its invariants first and records afterwards, so a record exists only
for a run that held. Records are JSON files in ``RESULTS_DIR`` (not committed);
``python -m tests.reliability.report`` renders them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = Path(
    os.environ.get("OUTBOX_RELIABILITY_RESULTS", ROOT / "benchmarks" / "results" / "reliability")
)


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """What one scenario did to one database, and what it found afterwards.

    ``lost``: events not published (or not in their expected final state) at the end.
    ``duplicated_completions``: events completed more than once (a fencing failure).
    ``late_completions_refused``: completions the fence turned away (expected > 0 where
    leases are made to expire). ``side_effect_repeats``: guarded side effects that ran
    twice inside the documented window; None where the scenario has none.
    """

    scenario: str
    database: str  # "sqlite", "postgresql", or "sqlite+postgresql"
    runs: int
    events: int
    kills: int = 0
    lost: int = 0
    duplicated_completions: int = 0
    late_completions_refused: int = 0
    side_effect_repeats: int | None = None
    command: str = ""
    soak: bool = False
    notes: list[str] = field(default_factory=list)
    # The commit the run tested ("" in records written before it was kept).
    commit: str = ""

    @property
    def key(self) -> str:
        return f"{self.scenario}-{self.database}"


def record(result: ScenarioResult) -> Path:
    """Write ``result`` (replacing an earlier run's record of the same scenario/database),
    with the commit it tested."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{result.key}.json"
    if not result.commit:
        result = replace(result, commit=current_commit())
    path.write_text(json.dumps(asdict(result), indent=2, sort_keys=True) + "\n")
    return path


def current_commit() -> str:
    """The checkout's short commit, with ``+`` when it has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""
    return f"{head}+" if head and dirty else head


def load_all(where: Path = RESULTS_DIR) -> list[ScenarioResult]:
    """Every record in ``where``, ordered by scenario then database."""
    results = []
    for path in sorted(where.glob("*.json")):
        data = json.loads(path.read_text())
        results.append(ScenarioResult(**data))
    return sorted(results, key=lambda r: (r.scenario, r.database))
