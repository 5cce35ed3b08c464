"""Two services: A's outbox → A's relay → RabbitMQ → B's inbox → B's transactional handler.

Service A (PostgreSQL) writes ``shop.order_placed`` events, about half of them ordered by
one of 20 keys, and relays them (``outbox-tui --dispatch --amqp-url``) to a topic
exchange. Service B (PostgreSQL, or SQLite) consumes them (``outbox-tui consume``) into
its own outbox, and its dispatcher (``outbox-tui --dispatch``) runs a transactional
handler that inserts one ``b_orders`` row per event, without a unique constraint, and
publishes a follow-up in the same transaction, whose handler inserts one ``b_invoices``
row (tests/reliability/two_services_app.py).

Faults: A's relay, B's consumer and B's dispatcher are killed with SIGKILL at random
moments, one at a time, each restarted at once (9 kills at CI sizes, 150 at soak), while
A keeps writing; once mid-run the broker itself (one of the test's own, never the
shared one) is killed with SIGKILL and started again on its data directory.

Afterwards: every A event yields exactly one inbound row at B, one ``b_orders`` row, one
follow-up event and one ``b_invoices`` row; 0 lost, 0 repeated; every key's rows at B
are in A's order; nothing is left in flight on either side.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

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
from tests.cli.conftest import REPO, Cli, cli  # noqa: F401 - shared fixture
from tests.conftest import PG_URL_ENV, _asyncpg_connect_args, _drop_database
from tests.inbox.own_services import OwnBroker, own_broker  # noqa: F401 - fixture
from tests.reliability import two_services_app as app
from tests.reliability.faults import (
    Dispatcher,
    completions,
    held_claims,
    install_commit_log,
    reproduce,
    spawn,
    stop_all,
    wait_started,
)
from tests.reliability.results import ScenarioResult, record

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgresql, pytest.mark.serial]

APP = "tests.reliability.two_services_app"
LEASE_SECONDS = 2
# (A events, kills): CI sizes, then --soak.
CI = (150, 9)
SOAK = (3000, 150)
SEED = 20261245
KEYS = 20
ROLES = ("relay", "consumer", "dispatcher")


@pytest.fixture
async def a_url() -> AsyncIterator[str]:
    """Service A's database: a fresh one of its own on the shared server (B may be there
    too, in the ``database_url`` fixture's)."""
    server = make_url(os.environ[PG_URL_ENV])
    name = f"a_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(**_asyncpg_connect_args(server))
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            await _drop_database(admin, name)
    finally:
        await admin.close()


def _drafts(count: int, rng: random.Random) -> tuple[list[OutboxEvent], list[tuple[str, int]]]:
    """A's events: half keyed (``order:k<n>``), each key's events numbered in write order."""
    drafts, order = [], []
    per_key: Counter[str] = Counter()
    for n in range(count):
        key = f"order:k{rng.randrange(KEYS)}" if rng.random() < 0.5 else None
        number = per_key[key] if key else 0
        if key:
            per_key[key] += 1
            order.append((key, number))
        drafts.append(
            OutboxEvent(app.ORDER_PLACED, {"n": number}, "order", f"o-{n}", ordering_key=key)
        )
    return drafts, order


async def _prepare(a: str, b: str) -> None:
    for url, business in ((a, False), (b, True)):
        engine = create_engine(url)
        try:
            await create_schema(engine)
            if business:
                async with engine.begin() as conn:
                    await conn.run_sync(app.business.create_all)
        finally:
            await engine.dispose()


async def _write(url: str, drafts: list[OutboxEvent]) -> None:
    """A's application writes ``drafts`` in its outbox, 25 to a unit of work, in order."""
    engine = create_engine(url)
    registry = EventRegistry()
    app.register(registry)
    try:
        for start in range(0, len(drafts), 25):
            context = TaskContext("acme", "shop", f"req-{start}")
            async with unit_of_work(engine, registry=registry, context=context) as session:
                await OutboxEventPublisher(session).publish_many(drafts[start : start + 25])
    finally:
        await engine.dispose()


class Fleet:
    """A's relay, B's consumer and B's dispatcher, each replaced by a new process when
    killed; every process started is kept (their exit codes and refusals are checked)."""

    def __init__(
        self,
        runner: Cli,
        where: Path,
        args: dict[str, tuple[str, ...]],
        env: dict[str, dict[str, str]],
    ) -> None:
        self.cli, self.where, self.args, self.env = runner, where, args, env
        self.started: list[Dispatcher] = []
        self.current: dict[str, Dispatcher] = {}

    def start(self, role: str) -> Dispatcher:
        process = spawn(
            self.cli, f"{role}-{len(self.started)}", self.args[role], self.env[role], self.where
        )
        self.started.append(process)
        self.current[role] = process
        return process

    async def ready(self, *roles: str) -> None:
        """Until the current process of each of ``roles`` (or of every role) has started."""
        for role in roles or tuple(self.current):
            await wait_started(self.current[role], within=120)


async def _drained(a: str, b: str, count: int) -> bool:
    """A relayed everything, and B published every received event and its follow-up."""
    a_engine, b_engine = create_engine(a), create_engine(b)
    try:
        async with a_engine.connect() as conn:
            a_open = (await conn.execute(select(t.c.id).where(t.c.status != "published"))).all()
        async with b_engine.connect() as conn:
            rows = (await conn.execute(select(t.c.event_type, t.c.status))).all()
    finally:
        await a_engine.dispose()
        await b_engine.dispose()
    b_done = Counter(event_type for event_type, status in rows if status == "published")
    return (
        not a_open
        and len(rows) == 2 * count
        and b_done == {app.ORDER_PLACED: count, app.INVOICE_REQUESTED: count}
    )


async def _state(a: str, b: str) -> dict[str, Any]:
    a_engine, b_engine = create_engine(a), create_engine(b)
    try:
        async with a_engine.connect() as conn:
            a_rows = (await conn.execute(select(t.c.id, t.c.aggregate_id, t.c.status))).all()
            a_attempts = (await conn.execute(select(t.c.id, t.c.attempt_count))).all()
        async with b_engine.connect() as conn:
            b_rows = (
                await conn.execute(
                    select(
                        t.c.id,
                        t.c.event_type,
                        t.c.status,
                        t.c.inbound_id,
                        t.c.causation_id,
                        t.c.aggregate_id,
                    )
                )
            ).all()
            orders = (
                await conn.execute(
                    select(
                        app.b_orders.c.order_ref, app.b_orders.c.ordering_key, app.b_orders.c.n
                    ).order_by(app.b_orders.c.id)
                )
            ).all()
            invoices = (await conn.execute(select(app.b_invoices.c.event_id))).all()
    finally:
        await a_engine.dispose()
        await b_engine.dispose()
    return {
        "a": a_rows,
        "a_attempts": a_attempts,
        "b": b_rows,
        "orders": orders,
        "invoices": invoices,
    }


async def _scenario(
    a: str, b: str, broker: OwnBroker, runner: Cli, where: Path, *, count: int, kills: int
) -> tuple[dict[str, Any], Fleet, float, list[tuple[str, int]]]:
    rng = random.Random(SEED)
    drafts, sent_order = _drafts(count, rng)
    await _prepare(a, b)
    await install_commit_log(b)
    exchange, queue = f"shop.events.{uuid.uuid4().hex[:8]}", f"billing.inbox.{uuid.uuid4().hex[:8]}"
    common = {"PYTHONPATH": str(REPO), app.SLEEP_ENV: "1,10"}
    loop = ("--idle-sleep-seconds", "0.05", "--lease-seconds", str(LEASE_SECONDS))
    loop += ("--batch-size", "20", "--max-attempts", "1000")  # kills spend attempts
    probes = ("--amqp-probe-seconds", "0.2", "--amqp-max-probe-seconds", "1")
    args = {
        "relay": (
            "--dispatch", "--installed-app", APP, "--amqp-url", broker.url,
            "--exchange", exchange, *probes, *loop, "--json",
        ),
        "consumer": (
            "consume", "--installed-app", APP, "--amqp-url", broker.url, "--queue", queue,
            "--bind", f"{exchange}:shop.#", "--single-active-consumer", "--prefetch", "50",
            "--max-batch", "10", "--heartbeat-seconds", "0.5", *probes, "--json",
        ),
        "dispatcher": ("--dispatch", "--installed-app", APP, *loop, "--json"),
    }  # fmt: skip
    env = {
        "relay": {**common, "OUTBOX_DATABASE_URL": a},
        "consumer": {**common, "OUTBOX_DATABASE_URL": b},
        "dispatcher": {**common, "OUTBOX_DATABASE_URL": b},
    }
    fleet = Fleet(runner, where, args, env)
    faults = [ROLES[n % len(ROLES)] for n in range(kills)]
    rng.shuffle(faults)
    broker_at = len(faults) // 2
    first = len(drafts) // 4
    step = -(-(len(drafts) - first) // len(faults))
    t0 = time.monotonic()
    try:
        fleet.start("consumer")  # it declares and binds the queue before A relays
        await fleet.ready()
        await _write(a, drafts[:first])
        fleet.start("relay")
        fleet.start("dispatcher")
        for n, role in enumerate(faults):
            # Only the victim must be running: the others' restarts overlap with its run.
            await fleet.ready(role)
            await _write(a, drafts[first + n * step : first + (n + 1) * step])
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            if n == broker_at:
                broker.kill()  # mid-run: every connection cut, the queue on disk
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                await broker.up()
            fleet.current[role].kill()
            fleet.start(role)
        await fleet.ready()
        deadline = time.monotonic() + 300
        while not await _drained(a, b, count):
            assert time.monotonic() < deadline, "not drained within 300 s"
            await asyncio.sleep(0.3)
    finally:
        codes = stop_all(fleet.started)
    assert codes == [0] * len(codes), [p.stderr()[-3000:] for p in fleet.started]
    took = time.monotonic() - t0
    return await _state(a, b), fleet, took, sent_order


async def test_every_event_of_a_yields_exactly_one_row_and_follow_up_at_b_in_order(
    a_url: str,
    database_url: str,
    own_broker: OwnBroker,  # noqa: F811
    cli: Cli,  # noqa: F811
    tmp_path: Path,
    soak: bool,
) -> None:
    count, kills = SOAK if soak else CI
    state, fleet, took, sent_order = await _scenario(
        a_url, database_url, own_broker, cli, tmp_path, count=count, kills=kills
    )
    a_rows, b_rows = state["a"], state["b"]
    a_refs = {aggregate_id for _id, aggregate_id, _status in a_rows}
    assert len(a_rows) == count and {s for _i, _a, s in a_rows} == {"published"}
    a_ids = {event_id for event_id, _ref, _status in a_rows}

    inbound = [r for r in b_rows if r.event_type == app.ORDER_PLACED]
    follow_ups = [r for r in b_rows if r.event_type == app.INVOICE_REQUESTED]
    # One inbound row per A event (its CloudEvents id is A's id), none lost, none twice.
    assert Counter(r.inbound_id for r in inbound) == Counter(a_ids)
    # One b_orders row per A event: the transactional handler ran once per event.
    orders = Counter(ref for ref, _key, _n in state["orders"])
    assert orders == Counter(a_refs)
    # One follow-up per received event, caused by it; one b_invoices row per follow-up.
    assert Counter(r.causation_id for r in follow_ups) == Counter(r.id for r in inbound)
    assert Counter(event_id for (event_id,) in state["invoices"]) == Counter(
        r.id for r in follow_ups
    )
    assert {r.status for r in b_rows} == {"published"}
    # Per-key order at B: each key's rows, in the order B committed them, are A's order.
    at_b: dict[str, list[int]] = {}
    for _ref, key, n in state["orders"]:
        if key is not None:
            at_b.setdefault(key, []).append(n)
    sent: dict[str, list[int]] = {}
    for key, n in sent_order:
        sent.setdefault(key, []).append(n)
    assert at_b == sent
    assert await held_claims(a_url) == 0 and await held_claims(database_url) == 0
    assert (await completions(database_url)).duplicated() == 0

    killed = [p for p in fleet.started if p.killed_at is not None]
    assert len(killed) == kills
    by_role = Counter(p.name.rsplit("-", 1)[0] for p in killed)
    assert set(by_role) == set(ROLES)
    b_kind = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    # How often the faults made a copy: deliveries B's consumers dropped as duplicates, and
    # A's publishes beyond one per event (a publish cut off or unrecorded is sent again).
    dropped = sum(_last_total(p, "duplicates") for p in fleet.started if "consumer" in p.name)
    republished = sum(attempts for *_rest, attempts in state["a_attempts"]) - count
    record(
        ScenarioResult(
            scenario="two services",
            database=f"postgresql→{b_kind}",
            runs=1,
            events=count,
            kills=len(killed),
            lost=0,
            duplicated_completions=0,
            late_completions_refused=sum(p.refused() for p in fleet.started),
            side_effect_repeats=0,
            command=reproduce("tests/reliability/test_two_services.py", soak=soak),
            soak=soak,
            notes=[
                f"A's outbox (PostgreSQL) → relay → RabbitMQ → B's inbox ({b_kind}) → a "
                f"transactional handler: {count:,} events, {len(sent_order):,} of them over "
                f"{KEYS} ordering keys; SIGKILLs: {by_role['relay']} relay, "
                f"{by_role['consumer']} consumer, {by_role['dispatcher']} B dispatcher, and "
                f"RabbitMQ killed once mid-run and started again, in {took:.0f} s; "
                f"{republished} publishes by A beyond one per event, {dropped} deliveries "
                "B's consumers dropped as duplicates (as far as their last lines said)",
                "every A event: exactly one inbound row, one handler row (no unique "
                "constraint), one follow-up and one follow-up row at B; each key's rows at "
                "B in A's order",
            ],
        )
    )


def _last_total(process: Dispatcher, name: str) -> int:
    """A counter of a process's run as far as its JSON lines said (a killed one says no
    summary: its last batch line)."""
    seen = 0
    for line in process.lines():
        totals = line if line.get("event") == "summary" else line.get("totals") or {}
        seen = max(seen, int(totals.get(name, 0) or 0))
    return seen
