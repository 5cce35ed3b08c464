"""``outbox-tui consume`` as a real process: bad input, SIGTERM, kill -9 between commit and
ack, waiting for a broker that is not there."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from engine import create_engine, create_schema
from engine.operating.insights import OutboxInsights
from tests.cli.conftest import REPO, Cli, cli, sigterm_handled  # noqa: F401 - shared fixture
from tests.inbox.conftest import Inbound, count, events, eventually
from tests.inbox.proxy import HoldingProxy

pytestmark = [pytest.mark.rabbitmq]

APP = "tests.inbox.inbox_app"
BACKLOG = 5000  # the SIGTERM test: far more than the consumer takes before the signal


def consume_args(inbound: Inbound, *extra: str, amqp_url: str | None = None) -> tuple[str, ...]:
    return (
        "consume",
        "--amqp-url",
        amqp_url or inbound.url,
        "--queue",
        inbound.queue,
        "--bind",
        inbound.binding,
        "--installed-app",
        APP,
        "--heartbeat-seconds",
        "0.2",
        "--heartbeat-min-interval-seconds",
        "0.05",
        "--amqp-probe-seconds",
        "0.1",
        "--amqp-max-probe-seconds",
        "0.3",
        "--json",
        *extra,
    )


def env_for(database_url: str) -> dict[str, str]:
    return {"OUTBOX_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}


class Consumer:
    """One ``outbox-tui consume --json`` process with its output in files."""

    def __init__(
        self, runner: Cli, args: tuple[str, ...], env: dict[str, str], where: Path
    ) -> None:
        self.out, self.err = where / f"consume-{id(self)}.out", where / f"consume-{id(self)}.err"
        with self.out.open("w") as stdout, self.err.open("w") as stderr:
            self.proc = runner.popen(*args, env=env, stdout=stdout, stderr=stderr)

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for line in self.out.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return found

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == kind]

    def acked(self) -> int:
        batches = self.of("batch")
        return int(batches[-1]["totals"]["acked"]) if batches else 0

    async def started(self) -> None:
        async def up() -> bool:
            assert self.proc.poll() is None, self.err.read_text()
            return bool(self.of("started"))

        await eventually(up, "the consumer to start", seconds=60)

    async def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.proc.wait, 60)
        assert self.proc.returncode == 0, self.err.read_text()
        assert "Traceback" not in self.err.read_text()
        [summary] = self.of("summary")
        return summary

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


@pytest.mark.parametrize(
    ("drop", "fragment"),
    [
        ("--amqp-url", "consume needs the broker: --amqp-url"),
        ("--queue", "consume needs a queue: --queue"),
        ("--installed-app", "consume needs --installed-app"),
    ],
)
def test_what_consume_needs_is_named_in_one_line(cli: Cli, sqlite_url, drop, fragment):  # noqa: F811
    args = list(consume_args(Inbound("amqp://app:s3cret@127.0.0.1:1/")))
    at = args.index(drop)
    del args[at : at + 2]
    result = cli(*args, env=env_for(sqlite_url))
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert fragment in line and "\n" not in line and "Traceback" not in result.output
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--bind", "no-colon", "--bind must be EXCHANGE:ROUTING_KEY"),
        ("--prefetch", "0", "--prefetch must be an integer between 1 and 65535"),
        ("--max-batch", "5000", "--max-batch must be an integer between 1 and 1000"),
        ("--amqp-url", "http://app:s3cret@host/", "must start with amqp://"),
    ],
)
def test_a_bad_value_is_one_line_and_no_password(cli: Cli, sqlite_url, flag, value, fragment):  # noqa: F811
    result = cli(
        *consume_args(Inbound("amqp://app:s3cret@127.0.0.1:1/"), flag, value),
        env=env_for(sqlite_url),
    )
    assert result.returncode == 2, result
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.output and "Traceback" not in result.output


async def test_sigterm_commits_and_acks_the_batch_in_hand_never_half(
    cli: Cli,  # noqa: F811
    database_url: str,
    inbound: Inbound,
    tmp_path: Path,
) -> None:
    await _schema(database_url)
    await inbound.declare()
    # The backlog is in the queue before the consumer starts: published while it consumed,
    # a fast consumer (SQLite) kept up with the publisher and took all before the SIGTERM.
    await inbound.publish(*events("term", BACKLOG))
    consumer = Consumer(
        cli,
        consume_args(inbound, "--prefetch", "40", "--max-batch", "10", "--instance-id", "c-term"),
        env_for(database_url),
        tmp_path,
    )
    try:
        await consumer.started()
        await sigterm_handled(consumer.proc)
        await eventually(lambda: _acked_at_least(consumer, 30), "some batches acked")
        summary = await consumer.stop()
    finally:
        consumer.kill()
    engine = create_engine(database_url)
    try:
        stored = await count(engine)
        beats = await OutboxInsights(engine).heartbeats()
    finally:
        await engine.dispose()
    left = await inbound.ready()
    assert summary["shutdown_requested"] is True
    assert stored == summary["acked"] == summary["stored"]  # every commit acked, no other
    assert stored + left == BACKLOG  # nothing lost, nothing half
    assert left > 0
    [beat] = [b for b in beats if b.instance_id == "c-term"]
    assert beat.kind == "consumer" and beat.state == "stopped"


async def test_a_kill_between_commit_and_ack_redelivers_and_leaves_one_row_each(
    cli: Cli,  # noqa: F811
    database_url: str,
    inbound: Inbound,
    tmp_path: Path,
) -> None:
    """The consumer's acks go through a proxy that holds them: it commits a batch, its ack
    stays in the proxy, then kill -9. The broker redelivers; each event stays one row."""
    await _schema(database_url)
    await inbound.declare()
    url = make_url(inbound.url.replace("amqp://", "postgresql://"))
    proxy = HoldingProxy(url.host or "127.0.0.1", url.port or 5672)
    await proxy.start()
    proxied = inbound.url.replace(f":{url.port}/", f":{proxy.port}/")
    consumer = Consumer(
        cli, consume_args(inbound, amqp_url=proxied), env_for(database_url), tmp_path
    )
    engine = create_engine(database_url)
    try:
        await consumer.started()
        await inbound.publish(*events("kill", 10))
        await eventually(lambda: _acked_at_least(consumer, 10), "the first ten acked")
        proxy.hold()  # from now on the consumer's acks never reach the broker
        await inbound.publish(*events("kill", 20))  # 10 copies, 10 new

        async def committed() -> bool:
            return await count(engine) == 20

        await eventually(committed, "the next ten committed")
        await eventually(lambda: _acked_at_least(consumer, 30), "their acks written")
        consumer.kill()
        await proxy.close()
        assert await count(engine) == 20

        async def redelivered() -> bool:
            return await inbound.ready() == 20

        await eventually(redelivered, "the twenty unacked messages back in the queue")
        again = Consumer(cli, consume_args(inbound), env_for(database_url), tmp_path)
        try:
            await again.started()
            await eventually(lambda: _acked_at_least(again, 20), "the redelivered acked")
            summary = await again.stop()
        finally:
            again.kill()
        assert summary["duplicates"] == 20 and summary["stored"] == 0
        assert await count(engine) == 20
        assert await inbound.ready() == 0
    finally:
        consumer.kill()
        await proxy.close()
        await engine.dispose()


async def test_a_broker_that_is_not_there_is_waited_for_and_named_in_the_heartbeat(
    cli: Cli,  # noqa: F811
    sqlite_url: str,
    inbound: Inbound,
    tmp_path: Path,
) -> None:
    await _schema(sqlite_url)
    nowhere = "amqp://app:s3cret@127.0.0.1:1/"
    consumer = Consumer(
        cli,
        consume_args(inbound, "--instance-id", "c-away", amqp_url=nowhere),
        env_for(sqlite_url),
        tmp_path,
    )
    engine = create_engine(sqlite_url)
    try:
        await consumer.started()

        async def waiting() -> bool:
            beats = await OutboxInsights(engine).heartbeats()
            reason = next((b.waiting_for for b in beats if b.instance_id == "c-away"), None)
            return reason is not None and reason.startswith("broker unavailable: ")

        await eventually(waiting, "the heartbeat to name the broker")
        await asyncio.sleep(0.5)  # a few probes
        assert consumer.proc.poll() is None
        summary = await consumer.stop()
    finally:
        consumer.kill()
        await engine.dispose()
    assert summary["acked"] == 0 and summary["last_error"].startswith("broker unavailable")
    [waited] = consumer.of("waiting")  # said once, however many probes
    assert "127.0.0.1:1" in waited["waiting_for"]
    output = consumer.out.read_text() + consumer.err.read_text()
    assert "s3cret" not in output
    assert len([line for line in consumer.err.read_text().splitlines() if "broker" in line]) == 1


async def _schema(url: str) -> None:
    engine = create_engine(url)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()


async def _acked_at_least(consumer: Consumer, n: int) -> bool:
    assert consumer.proc.poll() is None, consumer.err.read_text()
    return consumer.acked() >= n
