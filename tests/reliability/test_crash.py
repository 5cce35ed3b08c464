"""Crash: dispatcher processes are SIGKILLed at random moments while a backlog drains.

Two scenarios. The first, below, checks delivery and per-key order; the second (under
load, at the end) checks the side-effect window at default concurrency.

Two ``outbox-tui --dispatch`` processes drain a backlog of ordered events (by key, both
dead-letter policies) and unordered ones, with random transient and permanent failures
(tests/cli/ordered_app.py); some handlers make an external call guarded by
``run_event_side_effect``. One process at a time is killed with SIGKILL at a random moment
and started again at once, so one always keeps running. The lease is short (2 s), so a
dead process's claims come back quickly.

Afterwards: every event is in the state its fate gives (published, dead letter, or
pending behind a blocking dead letter) and nothing is left in ``publishing``; per key,
executions follow write order and never overlap (a killed execution ends at its kill);
no claim is completed twice and no event is published twice (commit log, faults.py); and
every guarded external call ran once, except where a process was killed between the
call and its record (the documented window), which is counted and reported.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from sqlalchemy import select

from engine import EventRegistry, OutboxEventPublisher, TaskContext, create_engine, unit_of_work
from engine.handlers.idempotency import SUCCEEDED
from engine.storage.schema import side_effects
from engine.writing.publisher import OutboxEvent
from tests.cli.conftest import (
    ORDERED_APP,
    REPO,
    Cli,
    dispatch_args,
    ordered_app_env,
    status_counts,
)
from tests.cli.test_ordered_processes import (
    _assert_key_order,
    _expected,
    _fates,
    _key_executions,
    _rows,
    _seed,
)
from tests.reliability import effects_app
from tests.reliability.effect_calls import read_effect_calls
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

LEASE_SECONDS = 2
BATCH_SIZE = 20
# (keys, events per key, unordered events, kills): CI sizes, then --soak.
CI = (150, 8, 1200, 30)
SOAK = (500, 8, 6000, 150)
SEED = 20261209


def window_summary(windows_ms: list[float]) -> str:
    """Median, 99th percentile and maximum of the side-effect windows, in milliseconds."""
    if not windows_ms:
        return "no call recorded"
    ordered = sorted(windows_ms)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return (
        f"p50 {at(0.5):.1f} ms, p99 {at(0.99):.1f} ms, max {ordered[-1]:.1f} ms "
        f"over {len(ordered):,} calls"
    )


async def _side_effect_records(url: str) -> Counter[str]:
    """Succeeded side-effect records per event."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(side_effects.c.event_id).where(side_effects.c.status == SUCCEEDED)
            )
            return Counter(r[0] for r in rows)
    finally:
        await engine.dispose()


async def _kill_at_random(
    cli: Cli,
    args: tuple[str, ...],
    env: dict[str, str],
    tmp_path: Path,
    url: str,
    kills: int,
    rng: random.Random,
    backlog: list[OutboxEvent],
) -> tuple[list[Dispatcher], int, int]:
    """Two slots; kill the older process of the two at a random moment, restart it, repeat.

    A kill waits until the other slot's process is up, so one keeps dispatching at every
    moment. A third of ``backlog`` is written first, the rest in one chunk just before
    each kill, so the victim is busy with it however fast this machine drains.
    Returns every process started, the claims the killed ones held, and how many events
    were not finished yet (pending, failed or publishing) at the last kill.
    """
    first = len(backlog) // 3
    await _seed(url, backlog[:first])
    started: list[Dispatcher] = []

    def start(slot: int) -> Dispatcher:
        dispatcher = spawn(cli, f"crash{slot}-{len(started)}", args, env, tmp_path)
        started.append(dispatcher)
        return dispatcher

    slots = [start(0), start(1)]
    held = at_last_kill = 0
    step = -(-(len(backlog) - first) // kills)  # ceiling division: every event is written
    for n in range(kills):
        victim = n % 2
        await wait_started(slots[1 - victim])  # the survivor is dispatching
        await wait_started(slots[victim])
        await _seed(url, backlog[first + n * step : first + (n + 1) * step])
        await asyncio.sleep(rng.uniform(0.0, 0.4))  # a random moment of its run
        held += await held_claims(url, slots[victim].name)
        if n == kills - 1:
            at_last_kill = await _unfinished(url)
        slots[victim].kill()
        slots[victim] = start(victim)
    for dispatcher in slots:
        await wait_started(dispatcher)
    return started, held, at_last_kill


async def _unfinished(url: str) -> int:
    """Events written so far that are not published or dead-lettered yet."""
    counts = await status_counts(url)
    return sum(counts.get(s, 0) for s in ("pending", "failed", "publishing"))


@pytest.mark.slow
async def test_sigkilled_dispatchers_lose_nothing_and_keep_key_order(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool
) -> None:
    keys, per_key, unordered, kills = SOAK if soak else CI
    rng = random.Random(SEED)
    drafts = _fates(
        rng,
        keys=keys,
        per_key=per_key,
        unordered=unordered,
        permanent=0.01,
        sleep_ms=(5, 60),
        effects=0.25,
    )
    await _seed(database_url, [])  # the schema; the events come while processes die
    await install_commit_log(database_url)
    log = tmp_path / "handled.log"
    env = ordered_app_env(database_url, log)
    args = dispatch_args(
        ORDERED_APP,
        "--batch-size",
        str(BATCH_SIZE),
        "--idle-sleep-seconds",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
        # Every kill spends an attempt of each event it interrupts: a generous budget
        # keeps the fates (fail n times, then succeed) what decides the final state.
        "--max-attempts",
        "50",
    )
    t0 = time.monotonic()
    dispatchers: list[Dispatcher] = []
    try:
        dispatchers, held, at_last_kill = await _kill_at_random(
            cli, args, env, tmp_path, database_url, kills, rng, drafts
        )
        kill_phase = time.monotonic() - t0
        before = await _rows(database_url)
        assert len(before) == len(drafts)
        expected = _expected(before)
        want = Counter(expected.values())
        deadline = time.monotonic() + 120
        while (counts := await status_counts(database_url)) != want:
            assert time.monotonic() < deadline, (counts, want)
            await asyncio.sleep(0.1)
    finally:
        codes = stop_all(dispatchers)
    assert codes == [0] * len(codes), [d.stderr()[-2000:] for d in dispatchers]
    killed = [d for d in dispatchers if d.killed_at is not None]
    assert len(killed) == kills

    after = {row["id"]: row for row in await _rows(database_url)}
    lost = sum(after[i]["status"] != status for i, status in expected.items())
    assert lost == 0
    assert await held_claims(database_url) == 0  # nothing left in publishing

    killed_at = {d.pid: d.killed_at for d in killed if d.killed_at is not None}
    executions, _pids = _key_executions(log, after, killed_at)
    _assert_key_order(executions, after)

    log_lines = [line.split() for line in log.read_text().splitlines()]
    starts = Counter(event_id for kind, event_id, _pid, _ns in log_lines if kind == "start")

    done = await completions(database_url)
    # Claims that never completed: cut off by a kill, then claimed again (at-least-once).
    cut_claims = sum(int(row["claim_version"]) for row in after.values()) - len(done.entries)
    duplicated = done.duplicated()
    assert duplicated == 0
    published = done.published_by()
    assert set(published) == {i for i, s in expected.items() if s == "published"}

    # Guarded external calls: one record per event; a call made again is allowed only
    # where a process was killed after the call and before its record (the window).
    calls: dict[str, list[str]] = defaultdict(list)
    called_at: dict[tuple[str, str], int] = {}
    windows_ms: list[float] = []  # call -> record committed, for the calls that got one
    for kind, event_id, pid, ns in log_lines:
        if kind == "effect":
            calls[event_id].append(pid)
            called_at[(event_id, pid)] = int(ns)
        elif kind == "recorded" and (event_id, pid) in called_at:  # not a replayed answer
            windows_ms.append((int(ns) - called_at.pop((event_id, pid))) / 1e6)
    records = await _side_effect_records(database_url)
    with_effect = {row["id"] for row in before if row["payload"].get("effect")}
    attempted = with_effect & set(starts)
    assert set(records) <= with_effect
    assert all(records[event_id] == 1 for event_id in records)
    assert set(calls) <= attempted
    cut_off: Counter[str] = Counter()  # killed pid -> its calls made again elsewhere
    for event_id, pids in calls.items():
        for pid in pids[:-1]:  # every call but the last was cut off by a kill
            assert pid in killed_at, f"{event_id}: called again after a clean run in {pid}"
            cut_off[pid] += 1
    repeats = sum(cut_off.values())
    # Each repeat needs a claim a kill cut off, and one process had at most a batch.
    assert repeats <= cut_claims
    assert max(cut_off.values(), default=0) <= BATCH_SIZE
    # Small: on PostgreSQL about one per kill at most. On SQLite the record waits for the
    # database-wide write lock after the call, so the window is wider (issue 9, defect 5).
    per_kill = 1 if database_url.startswith("postgresql") else 3
    assert repeats <= per_kill * kills, (repeats, kills)
    refused = sum(d.refused() for d in dispatchers)

    record(
        ScenarioResult(
            scenario="crash",
            database=database_name(database_url),
            runs=1,
            events=len(before),
            kills=len(killed),
            lost=lost,
            duplicated_completions=duplicated,
            late_completions_refused=refused,
            side_effect_repeats=repeats,
            command=reproduce("tests/reliability/test_crash.py", soak=soak),
            soak=soak,
            notes=[
                f"{len(before):,} events ({keys} keys x {per_key} ordered, {unordered:,} "
                f"unordered), 2 processes, lease {LEASE_SECONDS} s; {len(killed)} SIGKILLs in "
                f"{kill_phase:.0f} s hit {held:,} claimed rows; at the last kill "
                f"{at_last_kill:,} events were unfinished (some pending behind a blocking "
                "dead letter for good)",
                f"{cut_claims:,} claims cut off by a kill and delivered again "
                f"(at-least-once); {sum(map(len, calls.values())):,} guarded external calls "
                f"for {len(records):,} side-effect records: {repeats} repeats, each after a "
                "kill between the call and its record (the documented window)",
                f"the window, from the call's return to its record committed: "
                f"{window_summary(windows_ms)}",
            ],
        )
    )


# -- under load: two guarded calls per event, default concurrency, a producer writing ----

EFFECTS_APP = "tests.reliability.effects_app"
# (events, kills): CI sizes, then --soak.
LOAD_CI = (1500, 20)
LOAD_SOAK = (6000, 80)
PRODUCER_CHUNK = 10  # events per producer transaction
# Issue 44's goals are one repeat per kill and a window p99 of 50 ms; on a shared two-core
# machine the new record path measured 0-1.9 and 23-143 ms, the old one 0.55-27 per kill
# and 0.35-18 s (decision 0037). The bounds leave room for a loaded machine and still fail
# the old path on SQLite; PostgreSQL's old path fails on its lost leases.
REPEATS_PER_KILL = 8
SQLITE_WINDOW_P99_MS = 500.0


async def _produce(url: str, chunks: asyncio.Queue[list[OutboxEvent] | None]) -> None:
    """The producer: writes each chunk it is given in small transactions, as a service
    would, while the dispatchers drain and die."""
    engine = create_engine(url)
    registry = EventRegistry()
    effects_app.register(registry)
    try:
        while (chunk := await chunks.get()) is not None:
            for start in range(0, len(chunk), PRODUCER_CHUNK):
                context = TaskContext("acme", "producer", f"req-{start}")
                async with unit_of_work(engine, registry=registry, context=context) as session:
                    await OutboxEventPublisher(session).publish_many(
                        chunk[start : start + PRODUCER_CHUNK]
                    )
    finally:
        await engine.dispose()


def _load(rng: random.Random, events: int) -> list[OutboxEvent]:
    return [
        OutboxEvent(effects_app.EVENT_TYPE, {"sleep_ms": rng.randint(5, 60)}, "order", f"o-{n}")
        for n in range(events)
    ]


@pytest.mark.slow
async def test_sigkilled_dispatchers_under_load_repeat_at_most_one_call_per_kill(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool
) -> None:
    """Two dispatchers at default batch size and concurrency, each event's handler making
    two guarded external calls, a producer writing throughout; one process killed at a
    random moment at a time. A call is made again only after a kill of the process that
    made it, between the call and its record, and at most a few times per kill; no live
    process loses a lease (records no longer starve completions of SQLite's write lock,
    nor rounds of PostgreSQL's pool); on SQLite the window stays short. The figures are
    recorded for docs/RELIABILITY.md (decision 0037)."""
    events, kills = LOAD_SOAK if soak else LOAD_CI
    rng = random.Random(SEED)
    drafts = _load(rng, events)
    await _seed(database_url, [])
    await install_commit_log(database_url)
    log = tmp_path / "effects.log"
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "EFFECTS_APP_LOG": str(log),
        "PYTHONPATH": str(REPO),
    }
    args = dispatch_args(
        EFFECTS_APP,
        "--idle-sleep-seconds",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--max-attempts",
        "50",
    )
    chunks: asyncio.Queue[list[OutboxEvent] | None] = asyncio.Queue()
    producer = asyncio.create_task(_produce(database_url, chunks))
    started: list[Dispatcher] = []

    def start(slot: int) -> Dispatcher:
        dispatcher = spawn(cli, f"load{slot}-{len(started)}", args, env, tmp_path)
        started.append(dispatcher)
        return dispatcher

    t0 = time.monotonic()
    try:
        first = len(drafts) // 4
        chunks.put_nowait(drafts[:first])
        slots = [start(0), start(1)]
        step = -(-(len(drafts) - first) // kills)
        for n in range(kills):
            victim = n % 2
            await wait_started(slots[1 - victim])
            await wait_started(slots[victim])
            chunks.put_nowait(drafts[first + n * step : first + (n + 1) * step])
            await asyncio.sleep(rng.uniform(0.1, 0.5))  # a random moment, mid-chunk
            slots[victim].kill()
            slots[victim] = start(victim)
        for dispatcher in slots:
            await wait_started(dispatcher)
        chunks.put_nowait(None)
        await producer
        kill_phase = time.monotonic() - t0
        deadline = time.monotonic() + 180
        while (counts := await status_counts(database_url)) != {"published": events}:
            assert time.monotonic() < deadline, counts
            await asyncio.sleep(0.1)
    finally:
        producer.cancel()
        codes = stop_all(started)
    assert codes == [0] * len(codes), [d.stderr()[-2000:] for d in started]
    killed = {d.pid: d.killed_at for d in started if d.killed_at is not None}
    assert len(killed) == kills
    done = await completions(database_url)
    assert done.duplicated() == 0
    assert await held_claims(database_url) == 0

    calls = read_effect_calls(log, killed)
    records = await _side_effect_records(database_url)
    assert len(records) == events and set(records.values()) == {2}  # one per effect key
    assert len(calls.called) == 2 * events
    lost_leases = sum(d.refused() for d in started)
    repeats_after_kill = sum(calls.repeats_after_kill.values())
    figures = (
        f"window {calls.summary()}; {repeats_after_kill} calls repeated after {kills} kills "
        f"({repeats_after_kill / kills:.2f} per kill), {len(calls.repeats_without_kill)} "
        f"without a kill; {lost_leases} leases lost"
    )
    assert calls.repeats_without_kill == [], figures
    assert lost_leases == 0, figures
    assert repeats_after_kill <= REPEATS_PER_KILL * kills, figures
    if database_name(database_url) == "sqlite":
        assert calls.percentile(0.99) <= SQLITE_WINDOW_P99_MS, figures

    record(
        ScenarioResult(
            scenario="crash under load",
            database=database_name(database_url),
            runs=1,
            events=events,
            kills=kills,
            lost=0,
            duplicated_completions=0,
            late_completions_refused=lost_leases,
            side_effect_repeats=calls.repeats,
            command=reproduce("tests/reliability/test_crash.py", soak=soak),
            soak=soak,
            notes=[
                f"{events:,} events, each handler making two guarded external calls, written "
                f"by a producer during the run; 2 processes at default batch size and "
                f"concurrency, lease {LEASE_SECONDS} s; {kills} SIGKILLs in {kill_phase:.0f} s",
                f"{calls.calls:,} guarded calls for {2 * events:,} records: "
                f"{repeats_after_kill} made again after a kill ({repeats_after_kill / kills:.2f} "
                f"per kill), {len(calls.repeats_without_kill)} without one; "
                f"{lost_leases} leases lost by processes never stopped",
                f"the window, from the call's return to the helper's (its record committed): "
                f"{calls.summary()}",
            ],
        )
    )
