"""Races: four dispatchers on one PostgreSQL backlog, two on one SQLite file, +/- ``--lock``.

All the processes are up and polling before the backlog is written (in one transaction),
so they race for it from the first row. A few events stall their dispatcher's whole
process past its lease (tests/cli/counting_app.py): the other dispatchers reclaim that
batch while the stalled one still means to complete it, so completions really do race.

Afterwards: every event is published, none is completed twice (commit log: no claim
completed twice, no event published twice), and every claim that did not complete was
refused to a late completer: the refusals the dispatchers report (``lost_leases``, in
their ``--json`` totals and heartbeats) equal the claims that never completed.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from engine import create_engine
from engine.storage.schema import outbox_events
from tests.cli.conftest import (
    COUNTING_APP,
    Cli,
    counting_app_env,
    dispatch_args,
    status_counts,
)
from tests.reliability.faults import (
    Dispatcher,
    completions,
    database_name,
    held_claims,
    reproduce,
    spawn,
    stop_all,
    wait_started,
)
from tests.reliability.results import ScenarioResult, record
from tests.reliability.test_lease_expiry import seed_counting, until

LEASE_SECONDS = 2
STALL_SECONDS = 3  # past the lease: the stalled dispatcher's completions come late
# (events, stalled events): CI sizes, then --soak.
CI = (400, 2)
SOAK = (6000, 10)
# A stalled batch's rows come back one per claim (engine.dispatch.store.claim_batch): keep it small.
BATCH = 10


async def _claim_versions(url: str) -> int:
    """Claims ever taken: each claim bumps its row's fencing token."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            total = await conn.execute(select(func.sum(outbox_events.c.claim_version)))
            return int(total.scalar_one())
    finally:
        await engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("lock", [False, True], ids=["no-lock", "lock"])
async def test_racing_dispatchers_complete_each_event_once_and_refuse_late_completions(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool, lock: bool
) -> None:
    events, stalls = SOAK if soak else CI
    processes = 4 if database_url.startswith("postgresql") else 2
    log, go = tmp_path / "handled.log", tmp_path / "go"
    go.touch()
    env = counting_app_env(database_url, log, go)
    args = dispatch_args(
        COUNTING_APP,
        "--batch-size",
        str(BATCH),
        "--idle-sleep-seconds",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
        *(("--lock",) if lock else ()),
    )
    stalled_at = {n * events // stalls for n in range(stalls)}
    payloads = [{"stall_seconds": STALL_SECONDS} if n in stalled_at else {} for n in range(events)]
    await seed_counting(database_url, [])  # schema and commit log; no event yet
    dispatchers: list[Dispatcher] = []
    try:
        for n in range(processes):
            dispatchers.append(spawn(cli, f"race{n}", args, env, tmp_path))
        for dispatcher in dispatchers:
            await wait_started(dispatcher)
        t0 = time.monotonic()
        await seed_counting(database_url, payloads, commit_log=False)

        async def drained() -> bool:
            return await status_counts(database_url) == {"published": events}

        await until(drained, "every event published", within=120)
        drain = time.monotonic() - t0

        async def reported() -> bool:  # the stalled ones have written their late outcomes
            return sum(d.refused() for d in dispatchers) >= stalls

        await until(reported, "the stalled dispatchers report their refusals")
    finally:
        codes = stop_all(dispatchers)
    assert codes == [0] * processes, [d.stderr()[-2000:] for d in dispatchers]
    assert await status_counts(database_url) == {"published": events}  # nothing lost
    assert await held_claims(database_url) == 0

    done = await completions(database_url)
    duplicated = done.duplicated()
    assert duplicated == 0
    assert len(done.published_by()) == events
    summaries = [d.summary() or {} for d in dispatchers]
    refused = sum(int(s["lost_leases"]) for s in summaries)
    storage_errors = sum(int(s["storage_errors"]) for s in summaries)
    uncompleted = await _claim_versions(database_url) - len(done.entries)
    assert refused >= stalls  # each stalled event's own completion came after its lease
    if storage_errors == 0:  # (a round's storage error leaves its outcomes to the lease)
        assert refused == uncompleted  # every claim taken over was refused to its holder
    else:
        assert refused <= uncompleted
    assert sum(int(s["published"]) for s in summaries) == events
    handled = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert len(handled) == events and max(handled.values()) <= 2
    workers = Counter(by for by in done.published_by().values())
    assert len(workers) >= 2, workers  # they really raced

    scenario = "races --lock" if lock else "races"
    record(
        ScenarioResult(
            scenario=scenario,
            database=database_name(database_url),
            runs=1,
            events=events,
            duplicated_completions=duplicated,
            late_completions_refused=refused,
            command=reproduce("tests/reliability/test_races.py", soak=soak),
            soak=soak,
            notes=[
                f"{processes} processes{' with --lock' if lock else ''}, lease "
                f"{LEASE_SECONDS} s, {stalls} handlers stalling their process "
                f"{STALL_SECONDS} s; drained in {drain:.1f} s; published per process "
                f"{sorted(workers.values(), reverse=True)}; {uncompleted} claims taken over, "
                f"{refused} late completions refused, {storage_errors} storage errors; "
                f"{sum(n > 1 for n in handled.values())} events handled twice (a stalled "
                "batch run late), each completed once"
            ],
        )
    )
