"""Rolling deploy (issue 9): an old and a new dispatcher run side by side while the new version
publishes a new event type.

``tests.reliability.app_v1`` (the old version) registers and handles ``reliability.a``;
``tests.reliability.app_v2`` (the new one) adds ``reliability.b``. The producer, already on
the new version, writes both. While only the old dispatcher runs, B events wait, pending
and unattempted (``stats`` names them: no dispatcher serves them), and nothing is
dead-lettered as unknown; once the new dispatcher runs beside the old, everything is
delivered, each event handled once, B events only by the new version. Then the old one is
stopped (the deploy completes) and the new one carries on alone.

tests/engine/test_served_types.py covers the claim logic in-process; this is the same with
real processes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from engine import create_engine
from engine.operating.insights import HeartbeatView, OutboxInsights, OverviewSnapshot
from tests.cli.conftest import Cli, cli, status_counts  # noqa: F401 - shared fixture
from tests.reliability.app_v1 import TYPE_A
from tests.reliability.app_v2 import TYPE_B
from tests.reliability.fleet import (
    DispatchProcess,
    database_name,
    eventually,
    handled,
    outbox_rows,
    seed,
)
from tests.reliability.results import ScenarioResult, record

pytestmark = [pytest.mark.slow]

COMMAND = 'make test PYTEST_ARGS="tests/reliability/test_rolling_deploy.py"'
SETTINGS = {
    "OUTBOX_DISPATCHER__BATCH_SIZE": "20",
    "OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS": "0.05",
    "OUTBOX_DISPATCHER__HEARTBEAT_SECONDS": "0.2",
    "OUTBOX_DISPATCHER__HEARTBEAT_MIN_INTERVAL_SECONDS": "0.1",
}


async def _overview(url: str) -> OverviewSnapshot:
    engine = create_engine(url)
    try:
        return await OutboxInsights(engine).overview()
    finally:
        await engine.dispose()


def _beat(snapshot: OverviewSnapshot, instance_id: str) -> HeartbeatView:
    return next(hb for hb in snapshot.heartbeats if hb.instance_id == instance_id)


async def test_old_and_new_dispatchers_side_by_side_deliver_everything(
    database_url: str,
    cli: Cli,  # noqa: F811
    tmp_path: Path,
    soak: bool,
) -> None:
    per_phase = 1000 if soak else 100
    log = tmp_path / "handled.log"
    env = {"OUTBOX_DATABASE_URL": database_url, "RELIABILITY_APP_LOG": str(log), **SETTINGS}
    await seed(database_url, 0, create=True)
    old = DispatchProcess(
        cli, "--installed-app", "tests.reliability.app_v1", env=env, instance_id="v1"
    )
    new: DispatchProcess | None = None
    ids: list[str] = []
    try:
        # The new version's producer is out first: A and B events, only v1 dispatching.
        ids += await seed(database_url, per_phase, event_type=TYPE_A, prefix="a1")
        b_ids = await seed(database_url, per_phase, event_type=TYPE_B, prefix="b1")
        ids += b_ids
        await old.started()

        async def a_delivered() -> bool:
            return (await status_counts(database_url)).get("published", 0) == per_phase

        await eventually(a_delivered, "v1 to deliver the A events")
        rounds_then = _beat(await _overview(database_url), "v1").iterations

        async def polled_more() -> bool:  # v1 keeps polling; B must stay untouched meanwhile
            return _beat(await _overview(database_url), "v1").iterations > rounds_then + 2

        await eventually(polled_more, "v1 to run rounds past the A events")
        snapshot = await _overview(database_url)
        assert _beat(snapshot, "v1").serves == [TYPE_A]
        [unserved] = snapshot.unserved  # `stats` and the console: no dispatcher serves these
        assert (unserved.event_type, unserved.count) == (TYPE_B, per_phase)
        waiting = {str(r["id"]): r for r in await outbox_rows(database_url)}
        assert all(
            waiting[i]["status"] == "pending" and waiting[i]["attempt_count"] == 0 for i in b_ids
        )
        assert not [r for r in waiting.values() if r["status"] == "dead_letter"]

        # The new version's dispatcher joins; the producer keeps writing both types.
        new = DispatchProcess(
            cli, "--installed-app", "tests.reliability.app_v2", env=env, instance_id="v2"
        )
        await new.started()
        for n in range(5):
            ids += await seed(database_url, per_phase // 5, event_type=TYPE_A, prefix=f"a2-{n}")
            ids += await seed(database_url, per_phase // 5, event_type=TYPE_B, prefix=f"b2-{n}")
            await asyncio.sleep(0.05)

        async def all_delivered() -> bool:
            return (await status_counts(database_url)).get("published", 0) == len(ids)

        await eventually(
            all_delivered,
            "both versions to deliver everything",
            explain=lambda: status_counts(database_url),
        )
        snapshot = await _overview(database_url)
        assert _beat(snapshot, "v2").serves == [TYPE_A, TYPE_B]
        assert snapshot.unserved == []

        # The deploy completes: v1 stops, v2 carries on alone.
        old_summary = await old.stop()
        ids += await seed(database_url, per_phase // 2, event_type=TYPE_A, prefix="a3")
        ids += await seed(database_url, per_phase // 2, event_type=TYPE_B, prefix="b3")
        await eventually(all_delivered, "v2 alone to deliver the rest")
        new_summary = await new.stop()
    finally:
        old.kill()
        if new is not None:
            new.kill()

    stored = await outbox_rows(database_url)
    assert Counter(r["status"] for r in stored) == Counter({"published": len(ids)})
    assert all(r["attempt_count"] == 1 for r in stored)  # no attempt wasted on the wrong version
    assert old_summary["dead_lettered"] == new_summary["dead_lettered"] == 0
    runs = handled(log.read_text().splitlines())
    pid_of = {"v1": str(old.proc.pid), "v2": str(new.proc.pid)}
    by_event = Counter(event_id for event_id, _type, _pid in runs)
    # Nothing skipped (every published event's handler ran) and nothing handled twice.
    assert set(by_event) == set(ids)
    twice = sum(n > 1 for n in by_event.values())
    assert twice == 0
    assert {pid for _id, event_type, pid in runs if event_type == TYPE_B} == {pid_of["v2"]}
    completions = old_summary["published"] + new_summary["published"]
    assert completions == len(ids)
    a_by_old = sum(pid == pid_of["v1"] for _id, _type, pid in runs)

    record(
        ScenarioResult(
            scenario="rolling-deploy",
            database=database_name(database_url),
            runs=1,
            events=len(ids),
            lost=len(ids) - sum(r["status"] == "published" for r in stored),
            duplicated_completions=completions - len(ids),
            late_completions_refused=old_summary["lost_leases"] + new_summary["lost_leases"],
            command=COMMAND,
            soak=soak,
            notes=[
                f"v1 (serves {TYPE_A}) alone, then beside v2 (serves {TYPE_A} and {TYPE_B}), "
                f"then v2 alone: {per_phase} B events waited unattempted and shown as unserved "
                f"while only v1 ran; 0 dead letters, 0 handled twice; v1 delivered {a_by_old} "
                f"A events, v2 {len(runs) - a_by_old} events (every B)",
            ],
        )
    )
