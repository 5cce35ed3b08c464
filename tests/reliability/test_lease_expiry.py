"""Lease expiry: a handler outlives its lease, another dispatcher reclaims the event.

Dispatcher A claims one event whose handler stalls its whole process (a synchronous
wait no handler timeout can end: tests/cli/counting_app.py) for much longer than A's
2 s lease. Dispatcher B, started next, drains the rest of the backlog, reclaims the
stalled event once A's lease has expired and publishes it. Only then is A's handler
let go: its completion comes late, and the fence must refuse it. Afterwards the event
is published once (one completion in the commit log, by B), A reports the refusal
(``lost_leases``), and every other event is published once too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.writing.publisher import OutboxEvent
from tests.cli import counting_app
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
    install_commit_log,
    reproduce,
    spawn,
    stop_all,
    wait_started,
)
from tests.reliability.results import ScenarioResult, record

EVENTS = 30
LEASE_SECONDS = 2


async def seed_counting(
    url: str, payloads: list[dict[str, float]], *, commit_log: bool = True
) -> None:
    """Schema, commit log (unless installed already), and one counting_app event per
    payload, in this order (seq)."""
    engine = create_engine(url)
    registry = EventRegistry()
    counting_app.register(registry)
    try:
        await create_schema(engine)
        drafts = [
            OutboxEvent(counting_app.EVENT_TYPE, payload, "tick", str(i))
            for i, payload in enumerate(payloads)
        ]
        for start in range(0, len(drafts), 50):
            context = TaskContext("acme", "tester", f"req-{start}")
            async with unit_of_work(engine, registry=registry, context=context) as session:
                await OutboxEventPublisher(session).publish_many(drafts[start : start + 50])
    finally:
        await engine.dispose()
    if commit_log:
        await install_commit_log(url)


async def until(condition: Callable[[], Awaitable[bool]], what: str, within: float = 60) -> None:
    """Poll ``condition`` until it holds; fail the test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within}s: {what}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_late_completion_is_refused_and_the_event_published_once(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool
) -> None:
    await seed_counting(database_url, [{"stall_seconds": 120}] + [{}] * (EVENTS - 1))
    log, go, release = tmp_path / "handled.log", tmp_path / "go", tmp_path / "release"
    go.touch()  # no barrier: handlers run at once
    env = counting_app_env(database_url, log, go, COUNTING_APP_RELEASE=str(release))
    args = dispatch_args(
        COUNTING_APP,
        "--idle-sleep-seconds",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
    )
    dispatchers: list[Dispatcher] = []
    try:
        a = spawn(cli, "lease-a", (*args, "--batch-size", "1"), env, tmp_path)
        dispatchers.append(a)
        await wait_started(a)
        # A holds the first event (seq order) and stalls in its handler.
        await until(lambda: _holds(database_url, a.name), "A claims the stalled event")
        # B's own lease is long: only A's is meant to run out (a 2 s lease of B's could too
        # on a loaded machine, which is not what this test is about).
        b_args = (*args, "--batch-size", "10", "--lease-seconds", "30")
        b = spawn(cli, "lease-b", b_args, env, tmp_path)
        dispatchers.append(b)
        await wait_started(b)

        async def all_published() -> bool:
            return await status_counts(database_url) == {"published": EVENTS}

        await until(all_published, "B publishes everything, the reclaimed event too")
        assert a.refused() == 0 and a.published() == 0  # A is still stalled
        release.touch()  # A's handler returns now, long after its lease

        async def a_refused() -> bool:
            return a.refused() > 0

        await until(a_refused, "A reports its refused completion")
    finally:
        codes = stop_all(dispatchers)
    assert codes == [0, 0], [d.stderr()[-2000:] for d in dispatchers]
    assert await status_counts(database_url) == {"published": EVENTS}

    summary_a, summary_b = a.summary(), b.summary()
    assert summary_a is not None and summary_b is not None
    assert summary_a["lost_leases"] == 1 and summary_a["published"] == 0
    assert summary_b["lost_leases"] == 0 and summary_b["published"] == EVENTS

    done = await completions(database_url)
    assert done.duplicated() == 0
    assert len(done.entries) == EVENTS  # one completion per event: nothing A wrote held
    assert set(done.published_by().values()) == {b.name}
    handled = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert sorted(handled.values()) == [1] * (EVENTS - 1) + [2]  # the stalled one: A and B

    record(
        ScenarioResult(
            scenario="lease expiry",
            database=database_name(database_url),
            runs=1,
            events=EVENTS,
            duplicated_completions=done.duplicated(),
            late_completions_refused=a.refused() + b.refused(),
            command=reproduce("tests/reliability/test_lease_expiry.py", soak=soak),
            soak=soak,
            notes=[
                f"two processes, lease {LEASE_SECONDS} s; a handler stalls its process past "
                "the lease, the other reclaims and publishes the event, then the stalled "
                "completion arrives and is refused (lost_leases 1); the event has one "
                "completion, by the reclaiming dispatcher"
            ],
        )
    )


async def _holds(url: str, name: str) -> bool:
    return await held_claims(url, name) == 1
