"""Exactly once: transactional handlers under SIGKILL and stalled dispatchers.

Two ``outbox-tui --dispatch`` processes drain ``chain.order`` events (some ordered by key)
with the transactional handlers of tests/reliability/chain_app.py: each order inserts one
``chain_invoices`` row, without a unique constraint, and publishes a ``chain.invoice``
in the same transaction; each invoice inserts one ``chain_receipts`` row. The processes
are SIGKILLed at random moments (one at a time, restarted at once), and now and then one
is stopped (SIGSTOP) for longer than its lease and resumed, so the other takes its claims
over while its handlers are mid-transaction.

Afterwards: every order has exactly one invoice row and exactly one follow-up event,
every follow-up exactly one receipt row; every event is published; no claim completed
twice. Not "within a window": zero repeats. The mutation check runs the same proof with
the writes and the record committed apart (plain handlers) and expects it to fail.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.storage.schema import outbox_events as t
from engine.writing.publisher import OutboxEvent
from tests.cli.conftest import REPO, Cli, dispatch_args
from tests.reliability import chain_app
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
# (orders, kills, stalls): CI sizes, then --soak.
CI = (1200, 30, 3)
SOAK = (6000, 150, 15)
SEED = 20261207
APP = "tests.reliability.chain_app"


def _drafts(count: int, rng: random.Random) -> list[OutboxEvent]:
    """Orders; a third of them ordered by one of 50 keys."""
    drafts = []
    for n in range(count):
        key = f"k{rng.randrange(50)}" if rng.random() < 1 / 3 else None
        drafts.append(
            OutboxEvent(chain_app.ORDER, {"key": key or ""}, "order", f"o-{n}", ordering_key=key)
        )
    return drafts


async def _prepare(url: str) -> None:
    engine = create_engine(url)
    try:
        await create_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(chain_app.business.create_all)
    finally:
        await engine.dispose()


async def _seed(url: str, drafts: list[OutboxEvent]) -> None:
    engine = create_engine(url)
    registry = EventRegistry()
    chain_app.register(registry)
    try:
        for start in range(0, len(drafts), 50):
            context = TaskContext("acme", "tester", f"req-{start}")
            async with unit_of_work(engine, registry=registry, context=context) as session:
                await OutboxEventPublisher(session).publish_many(drafts[start : start + 50])
    finally:
        await engine.dispose()


async def _faults(
    cli: Cli,
    args: tuple[str, ...],
    env: dict[str, str],
    where: Path,
    url: str,
    drafts: list[OutboxEvent],
    kills: int,
    stalls: int,
    rng: random.Random,
    producing: bool,
) -> tuple[list[Dispatcher], int]:
    """Two slots; each fault hits the older slot's process at a random moment of its run:
    a SIGKILL (then a new process) or a stall longer than the lease. The backlog arrives
    in chunks, one before each fault, so the victim is busy. Returns every process
    started and how many stalls there were. Not ``producing``: the whole backlog first."""
    faults = ["kill"] * kills + ["stall"] * stalls
    rng.shuffle(faults)
    first = len(drafts) // 3 if producing else len(drafts)
    await _seed(url, drafts[:first])
    started: list[Dispatcher] = []

    def start(slot: int) -> Dispatcher:
        dispatcher = spawn(cli, f"once{slot}-{len(started)}", args, env, where)
        started.append(dispatcher)
        return dispatcher

    slots = [start(0), start(1)]
    step = -(-(len(drafts) - first) // len(faults))
    for n, fault in enumerate(faults):
        victim = n % 2
        await wait_started(slots[1 - victim])
        await wait_started(slots[victim])
        await _seed(url, drafts[first + n * step : first + (n + 1) * step])
        await asyncio.sleep(rng.uniform(0.0, 0.4))
        if fault == "kill":
            slots[victim].kill()
            slots[victim] = start(victim)
        else:  # its leases run out while it is stopped; the other takes its claims over
            slots[victim].proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(LEASE_SECONDS + 1)
            slots[victim].proc.send_signal(signal.SIGCONT)
    for dispatcher in slots:
        await wait_started(dispatcher)
    return started, stalls


async def _counts(url: str) -> tuple[Counter[str], Counter[str], Counter[str], dict[str, str]]:
    """Invoice rows per order event, follow-up events per cause, receipt rows per invoice
    event, and every event's status."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            invoices = Counter(
                r[0] for r in await conn.execute(select(chain_app.invoices.c.event_id))
            )
            receipts = Counter(
                r[0] for r in await conn.execute(select(chain_app.receipts.c.event_id))
            )
            follow_ups = Counter(
                r[0]
                for r in await conn.execute(
                    select(t.c.causation_id).where(t.c.event_type == chain_app.INVOICE)
                )
            )
            statuses = {r[0]: r[1] for r in await conn.execute(select(t.c.id, t.c.status))}
    finally:
        await engine.dispose()
    return invoices, follow_ups, receipts, statuses


async def _drained(url: str, orders: int) -> bool:
    """Every order published and nothing left to deliver (each published order's follow-up
    was written with it)."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            by_type_and_status = select(t.c.event_type, t.c.status, func.count()).group_by(
                t.c.event_type, t.c.status
            )
            counts = {(r[0], r[1]): r[2] for r in await conn.execute(by_type_and_status)}
    finally:
        await engine.dispose()
    unfinished = sum(n for (_type, status), n in counts.items() if status != "published")
    return counts.get((chain_app.ORDER, "published"), 0) == orders and unfinished == 0


async def _run(
    database_url: str,
    cli: Cli,
    tmp_path: Path,
    *,
    orders: int,
    kills: int,
    stalls: int,
    mutant: bool,
) -> tuple[list[Dispatcher], tuple[Counter[str], Counter[str], Counter[str], dict[str, str]]]:
    rng = random.Random(SEED)
    drafts = _drafts(orders, rng)
    await _prepare(database_url)
    await install_commit_log(database_url)
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "PYTHONPATH": str(REPO),
        "OUTBOX_DISPATCHER__BACKOFF_KIND": "fixed",
        "OUTBOX_DISPATCHER__BACKOFF_BASE_SECONDS": "0.05",
        "OUTBOX_DISPATCHER__BACKOFF_JITTER": "0",
        chain_app.SLEEP_ENV: "1,15",
        **({chain_app.MUTANT_ENV: "1"} if mutant else {}),
    }
    args = dispatch_args(
        APP,
        "--batch-size",
        str(BATCH_SIZE),
        "--idle-sleep-seconds",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--max-attempts",
        "100",  # kills and stalls spend attempts; the budget must not decide the end state
    )
    dispatchers: list[Dispatcher] = []
    try:
        dispatchers, _stalls = await _faults(
            cli, args, env, tmp_path, database_url, drafts, kills, stalls, rng, producing=not mutant
        )
        deadline = time.monotonic() + 180
        while not await _drained(database_url, orders):
            assert time.monotonic() < deadline, await _counts(database_url)
            await asyncio.sleep(0.2)
    finally:
        codes = stop_all(dispatchers)
    assert codes == [0] * len(codes), [d.stderr()[-2000:] for d in dispatchers]
    return dispatchers, await _counts(database_url)


@pytest.mark.slow
async def test_transactional_effects_happen_exactly_once_under_kills_and_stalls(
    database_url: str, cli: Cli, tmp_path: Path, soak: bool
) -> None:
    orders, kills, stalls = SOAK if soak else CI
    t0 = time.monotonic()
    dispatchers, (invoices, follow_ups, receipts, statuses) = await _run(
        database_url, cli, tmp_path, orders=orders, kills=kills, stalls=stalls, mutant=False
    )
    took = time.monotonic() - t0
    order_ids = {i for i, _s in statuses.items() if i in invoices or i in follow_ups}
    assert len(statuses) == 2 * orders  # every order has its follow-up, and only one
    assert len(invoices) == len(follow_ups) == orders
    assert set(invoices) == set(follow_ups) == order_ids
    assert set(invoices.values()) == {1}  # one invoice row per order: zero repeats
    assert set(follow_ups.values()) == {1}  # one follow-up event per order
    invoice_events = set(statuses) - order_ids
    assert set(receipts) == invoice_events
    assert set(receipts.values()) == {1}  # follow-ups delivered, once
    assert set(statuses.values()) == {"published"}
    assert await held_claims(database_url) == 0
    done = await completions(database_url)
    assert done.duplicated() == 0
    killed = [d for d in dispatchers if d.killed_at is not None]
    assert len(killed) == kills
    refused = sum(d.refused() for d in dispatchers)
    record(
        ScenarioResult(
            scenario="exactly-once",
            database=database_name(database_url),
            runs=1,
            events=len(statuses),
            kills=len(killed),
            lost=0,
            duplicated_completions=0,
            late_completions_refused=refused,
            side_effect_repeats=0,
            command=reproduce("tests/reliability/test_exactly_once.py", soak=soak),
            soak=soak,
            notes=[
                f"{orders:,} orders through two transactional handlers (an invoice row and a "
                f"follow-up event, then a receipt row), 2 processes, lease {LEASE_SECONDS} s; "
                f"{len(killed)} SIGKILLs and {stalls} stalls longer than the lease in "
                f"{took:.0f} s",
                "business rows without a unique constraint: one invoice per order, one "
                "follow-up per order, one receipt per follow-up (0 repeats, not a window)",
            ],
        )
    )


@pytest.mark.slow
async def test_the_proof_fails_when_the_record_commits_apart_from_the_writes(
    database_url: str, cli: Cli, tmp_path: Path
) -> None:
    """The mutation check: plain handlers commit their writes in a unit of work of their
    own, before the event's completion; the same faults then repeat some writes (a stall
    past the lease repeats every handler it caught between its commit and the round's
    completion). The backlog is written up front: on SQLite, many plain handlers each
    polling for the write lock would keep a producer out."""
    _dispatchers, (invoices, _follow_ups, receipts, _statuses) = await _run(
        database_url, cli, tmp_path, orders=400, kills=8, stalls=2, mutant=True
    )
    repeated = sum(n - 1 for n in invoices.values()) + sum(n - 1 for n in receipts.values())
    assert repeated > 0, "the exactly-once proof would not notice a record committed apart"
