"""Broker outage (issue 9): RabbitMQ stops and restarts while ``outbox-tui --dispatch`` relays
drain a backlog, one relay on SQLite and one on PostgreSQL, through the same outage.

The application keeps writing throughout, so the relays are busy when the broker goes and
a backlog builds while it is away. Nothing is lost (every event reaches the queue; consumers
dedupe by ``message_id``), no
dead letter comes from the outage although ``--max-attempts 3`` with a 0.5 s fixed backoff
would dead-letter a burning backlog within seconds, and attempts follow the rule "one per
publish that may have reached the broker": the only extra attempts are publishes in flight
when the connection was cut; the call that discovers the outage and every round while the
circuit is open spend none and claim nothing. After ``start_app`` the backlog drains.

The broker is stopped with ``rabbitmqctl stop_app`` (the relay tests' ``broker`` fixture),
so this test is ``serial``. Both databases share one outage because each ``rabbitmqctl``
call boots an Erlang VM (about 2 s): one stop/start cycle keeps the scenario inside the CI
budget. Each database still gets its own relay process, queue check and record.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from engine import create_engine
from engine.operating.insights import OutboxInsights
from tests.cli.conftest import Cli, cli, status_counts  # noqa: F401 - shared fixture
from tests.relay.conftest import BrokerControl, Topology, broker, topology  # noqa: F401
from tests.reliability.fleet import DispatchProcess, eventually, outbox_rows, seed
from tests.reliability.results import ScenarioResult, record

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgresql, pytest.mark.serial]

COMMAND = 'make test PYTEST_ARGS="tests/reliability/test_broker_outage.py"'
BATCH = 20
SETTINGS = {
    "OUTBOX_DISPATCHER__BACKOFF_KIND": "fixed",
    "OUTBOX_DISPATCHER__BACKOFF_BASE_SECONDS": "0.5",
    "OUTBOX_DISPATCHER__BACKOFF_MAX_SECONDS": "0.5",
    "OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS": "0.05",
    "OUTBOX_DISPATCHER__HEARTBEAT_SECONDS": "0.2",
    "OUTBOX_DISPATCHER__HEARTBEAT_MIN_INTERVAL_SECONDS": "0.1",
    # Probes every 0.2-0.5 s: the drain resumes within half a second of start_app.
    "OUTBOX_AMQP_PROBE_SECONDS": "0.2",
    "OUTBOX_AMQP_MAX_PROBE_SECONDS": "0.5",
}
# The application writes this many events per database every 0.1 s, before, during and
# after the outage, so the relays are busy whenever the broker goes (rabbitmqctl takes about
# 2 s to land, longer than any machine needs for the initial backlog).
PRODUCER_CHUNK = 20


@dataclass
class Lane:
    """One database, its relay process and every event written to it."""

    database: str
    url: str
    relay: DispatchProcess
    ids: list[str] = field(default_factory=list)

    async def waiting_for(self) -> str | None:
        engine = create_engine(self.url)
        try:
            beats = await OutboxInsights(engine).heartbeats()
        finally:
            await engine.dispose()
        return next((b.waiting_for for b in beats if b.instance_id == self.relay.instance_id), None)

    async def published(self) -> int:
        return (await status_counts(self.url)).get("published", 0)


async def test_broker_outage_loses_nothing_spends_no_attempts_and_drains(
    sqlite_url: str,
    pg_url: str,
    cli: Cli,  # noqa: F811
    topology: Topology,  # noqa: F811
    broker: BrokerControl,  # noqa: F811
    soak: bool,
) -> None:
    backlog = 4000 if soak else 500
    down_at_least = 6.0 if soak else 1.0  # seconds the broker stays away after stop_app
    await topology.bind()
    lanes: list[Lane] = []
    for database, url in (("sqlite", sqlite_url), ("postgresql", pg_url)):
        await seed(url, 0, create=True)  # the schema; the backlog goes in while relays boot
        relay = DispatchProcess(
            cli,
            "--installed-app",
            "tests.reliability.app_v1",
            "--amqp-url",
            topology.url,
            "--exchange",
            topology.exchange,
            "--batch-size",
            str(BATCH),
            "--max-attempts",
            "3",
            env={"OUTBOX_DATABASE_URL": url, **SETTINGS},
            instance_id=f"relay-{database}",
        )
        lanes.append(Lane(database, url, relay))
    for lane in lanes:
        lane.ids += await seed(lane.url, backlog, prefix="backlog")
    producing = asyncio.Event()
    producing.set()

    async def producer() -> None:  # the application keeps writing through the outage
        n = 0
        while producing.is_set():
            for lane in lanes:
                lane.ids += await seed(lane.url, PRODUCER_CHUNK, prefix=f"p{n}")
            n += 1
            await asyncio.sleep(0.1)

    writer: asyncio.Task[None] | None = None
    try:
        for lane in lanes:
            await lane.relay.started()
        writer = asyncio.create_task(producer())
        for lane in lanes:

            async def relaying(lane: Lane = lane) -> bool:
                return lane.relay.totals().get("published", 0) >= 2 * BATCH

            await eventually(relaying, f"the {lane.database} relay to publish its first rounds")
        await broker.stop()  # mid-run: rabbitmqctl stop_app closes every connection
        stopped_at = time.monotonic()
        for lane in lanes:

            async def waiting(lane: Lane = lane) -> bool:
                reason = await lane.waiting_for()
                return reason is not None and reason.startswith("broker unavailable: ")

            await eventually(waiting, f"the {lane.database} heartbeat to name the outage")
        # The circuits are open: rounds claim nothing (no iteration line) and spend nothing.
        # The round that found the outage prints its line after its heartbeat: read the
        # counts once they hold still for a second (a loaded machine prints late).
        claimed_when_open: list[int] | None = None
        settle_by = time.monotonic() + 20
        while (now := [lane.relay.totals()["claimed"] for lane in lanes]) != claimed_when_open:
            assert time.monotonic() < settle_by, "the claimed counts never held still"
            claimed_when_open = now
            await asyncio.sleep(1.0)
        await asyncio.sleep(max(0.0, down_at_least - (time.monotonic() - stopped_at)))
        for lane, before in zip(lanes, claimed_when_open, strict=True):
            assert lane.relay.totals()["claimed"] == before, lane.relay.output()
            during = await outbox_rows(lane.url)
            assert not [r for r in during if r["status"] == "dead_letter"]
            untried = [r for r in during if r["status"] == "pending"]
            assert untried and all(r["attempt_count"] == 0 for r in untried)
            assert max(int(str(r["attempt_count"])) for r in during) <= 1
            assert lane.relay.running

        await broker.start()
        down_for = time.monotonic() - stopped_at
        await asyncio.sleep(0.3)  # a little more traffic after the restart
        producing.clear()
        await writer
        for lane in lanes:

            async def drained(lane: Lane = lane) -> bool:
                return await lane.published() == len(lane.ids)

            await eventually(
                drained,
                f"the {lane.database} backlog to drain after the restart",
                seconds=60,
                explain=lambda lane=lane: status_counts(lane.url),
            )
        summaries = await asyncio.gather(*(lane.relay.stop() for lane in lanes))
    finally:
        producing.clear()
        if writer is not None and not writer.done():
            writer.cancel()
        for lane in lanes:
            lane.relay.kill()

    everything = {event_id for lane in lanes for event_id in lane.ids}
    received = await topology.drain(everything, wait_seconds=30)
    copies = Counter(m.message_id for m in received)
    for lane, summary in zip(lanes, summaries, strict=True):
        stored = await outbox_rows(lane.url)
        assert Counter(r["status"] for r in stored) == Counter({"published": len(lane.ids)})
        lost = len(set(lane.ids) - set(copies))
        assert lost == 0
        attempts = {str(r["id"]): int(str(r["attempt_count"])) for r in stored}
        # An event reaches the queue at most once per publish, and every publish is an attempt.
        assert all(copies[event_id] <= attempts[event_id] for event_id in lane.ids)
        # One attempt per event that was sent, plus one per publish the cut caught in flight
        # (failed, then retried); the discovering call and the open circuit spend none.
        extra = sum(attempts.values()) - len(lane.ids)
        assert extra == summary["failed"] <= 2 * BATCH, (extra, summary)
        assert summary["dead_lettered"] == 0 and summary["lost_leases"] == 0
        assert summary["published"] == len(lane.ids)
        handed_back = summary["claimed"] - summary["published"] - summary["failed"]
        assert 0 <= handed_back <= 2 * BATCH, summary  # no claim churn while the broker was away
        # The outage hit claimed work (mid-run): the round that found it held events, and
        # they went back unattempted or, caught in flight, failed once.
        assert handed_back + summary["failed"] > 0, summary
        warnings = [line for line in lane.relay.errors if "broker unavailable" in line]
        assert warnings, lane.relay.output()  # said once, on one line
        duplicates = sum(copies[event_id] - 1 for event_id in lane.ids)
        record(
            ScenarioResult(
                scenario="broker-outage",
                database=lane.database,
                runs=1,
                events=len(lane.ids),
                lost=lost,
                duplicated_completions=summary["published"] - len(lane.ids),
                late_completions_refused=summary["lost_leases"],
                command=COMMAND,
                soak=soak,
                notes=[
                    f"RabbitMQ stopped (stop_app) mid-run, away {down_for:.1f} s from "
                    f"stop_app's return to start_app's; backlog "
                    f"{backlog}, {len(lane.ids) - backlog} more written during the run "
                    "by the producer; "
                    f"{summary['failed']} publish(es) in flight at the cut failed and were "
                    f"retried (the only extra attempts), {handed_back} claimed event(s) went "
                    f"back unattempted, 0 dead letters with --max-attempts 3; {duplicates} "
                    "duplicate message(s) in the queue (at-least-once, deduped by message_id)",
                ],
            )
        )
