"""``outbox-tui dispatch`` (alias ``--dispatch``) and ``dispatch-once``.

Both describe their dispatcher once, as an ``engine.service.DispatchSpec``
built from the settings (flags over ``OUTBOX_...`` variables), and open it with
``open_dispatcher``, like the console's ``s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

from engine.dispatch import default_dispatcher_id
from engine.errors import ConfigurationError
from engine.running.metrics import OutboxMetrics, serve_metrics
from engine.running.summary import RunSummary
from engine.service import DispatchSpec, load_registry, open_dispatcher, run
from engine.settings import DispatcherSettings
from engine.storage.database import storage_errors
from engine.storage.secrets import mask_url
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.event_loop import STOP_REQUESTED
from outbox_tui.cli.options import (
    Invocation,
    add_broker,
    add_json,
    add_settings,
    positive_int,
    subparser,
    text_of_at_most,
)
from outbox_tui.entry import terminated_during_start_up
from outbox_tui.output import RunReporter

log = logging.getLogger("outbox_tui.cli")


def register(sub: Any) -> None:
    loop = subparser(
        sub,
        "dispatch",
        "run the dispatcher loop until SIGTERM/SIGINT (alias: --dispatch)",
        "Run rounds (claim a batch, deliver it, record the outcomes) until SIGTERM or "
        "SIGINT, or --max-iterations rounds; then print a summary. `outbox-tui --dispatch` "
        "is the same command.",
        f"{PROG} dispatch --installed-app outbox_tui.examples.orders --json",
        f"{PROG} --dispatch --amqp-url amqp://guest:guest@rabbit/ --metrics-port 9100",
    )
    _add_dispatcher_options(loop)
    run_group = loop.add_argument_group("run")
    run_group.add_argument(
        "--instance-id",
        metavar="ID",
        type=INSTANCE_ID,
        default=argparse.SUPPRESS,
        help="dispatcher and heartbeat id (default <host>:<pid>)",
    )
    run_group.add_argument(
        "--max-iterations",
        metavar="N",
        type=positive_int,
        default=argparse.SUPPRESS,
        help="stop after N rounds (default: run until SIGTERM/SIGINT)",
    )
    run_group.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        default=argparse.SUPPRESS,
        help="serve Prometheus metrics on PORT (/metrics)",
    )
    run_group.add_argument(
        "--metrics-host",
        metavar="HOST",
        default=argparse.SUPPRESS,
        help="address for --metrics-port (default 127.0.0.1)",
    )
    add_json(run_group, "one JSON object per line on stdout")
    loop.set_defaults(run=dispatch)

    once = subparser(
        sub,
        "dispatch-once",
        "claim and deliver one batch, print what happened",
        "Claim one batch of due events, deliver it (handlers or --amqp-url) and record "
        "the outcomes. Writes no heartbeat.",
        f"{PROG} dispatch-once --installed-app outbox_tui.examples.orders --json",
        f"{PROG} dispatch-once --amqp-url amqp://guest:guest@localhost/ --batch-size 500",
    )
    _add_dispatcher_options(once)
    once.add_argument(
        "--instance-id",
        metavar="ID",
        type=INSTANCE_ID,
        default=argparse.SUPPRESS,
        help="dispatcher id (default <host>:<pid>)",
    )
    add_json(once, "print one JSON object")
    once.set_defaults(run=dispatch_once)


def _add_dispatcher_options(parser: argparse.ArgumentParser) -> None:
    add_broker(parser)
    group = parser.add_argument_group("dispatcher settings (override OUTBOX_DISPATCHER__*)")
    add_settings(group, DispatcherSettings)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 0 and 65535, got {value}")
    return value


# The heartbeat's instance_id and the lease's locked_by hold 200 characters.
INSTANCE_ID = text_of_at_most(200)


def spec_of(inv: Invocation) -> DispatchSpec:
    """The dispatcher this invocation describes (refused when it could deliver nothing)."""
    registry = load_registry(inv.installed_apps, app_dir=inv.app_dir)
    instance_id = inv.opt("instance_id") or default_dispatcher_id()
    spec = DispatchSpec(inv.settings, registry, tuple(inv.installed_apps), instance_id)
    spec.check()
    return spec


async def dispatch_once(inv: Invocation) -> int:
    spec = spec_of(inv)
    async with (
        open_dispatcher(spec, purpose="command") as dispatcher,
        storage_errors(inv.database_url),
    ):
        result = await dispatcher.dispatch_once()
    record = output.dispatch_once_record(result.as_dict(), spec.dispatcher_id)
    if inv.json:
        inv.out.json(record)
    else:
        inv.out.console.print(output.counters_table("dispatch-once", record))
    return EXIT_OK


@contextlib.contextmanager
def _metrics(inv: Invocation) -> Iterator[tuple[OutboxMetrics | None, int | None]]:
    port = inv.opt("metrics_port")
    if port is None:
        yield None, None
        return
    metrics = OutboxMetrics()
    host = inv.opt("metrics_host") or "127.0.0.1"
    try:
        server = serve_metrics(port, metrics.registry, host=host)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
    try:
        yield metrics, server.server_port
    finally:
        server.shutdown()


@contextlib.contextmanager
def _shutdown_on_signals(shutdown: asyncio.Event, starting: list[bool]) -> Iterator[None]:
    """SIGTERM/SIGINT stop the run cleanly at any moment.

    While ``starting[0]`` is true (settings, apps, database, broker, metrics), the
    start-up is cancelled: nothing is claimed yet. Afterwards they ask the loop to
    let the handlers in flight finish and stop; a second SIGINT aborts.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def request(signame: str) -> None:
        if not shutdown.is_set():
            if starting[0]:
                log.warning("%s received during start-up: stopping", signame)
                if task is not None and not task.cancelling():  # not cancelled by run_coroutine
                    task.cancel(msg=STOP_REQUESTED)
            else:
                log.warning("%s received: finishing the handlers in flight, then stopping", signame)
            shutdown.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C interrupts at once

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request, sig.name)
    if terminated_during_start_up():  # its exception was lost (see outbox_tui.entry)
        request(signal.SIGTERM.name)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _run_details(inv: Invocation, spec: DispatchSpec, metrics_port: int | None) -> dict[str, Any]:
    settings = spec.settings
    return {
        "instance_id": spec.dispatcher_id,
        "database_url": inv.masked_url,
        "delivery": "rabbitmq" if spec.relaying else "handlers",
        "amqp_url": mask_url(settings.amqp_url) if settings.amqp_url else None,
        "exchange": settings.exchange if spec.relaying else None,
        "installed_apps": list(spec.installed_apps),
        "max_iterations": inv.opt("max_iterations"),
        "metrics_port": metrics_port,
        "settings": settings.dispatcher.model_dump(mode="json"),
    }


async def dispatch(inv: Invocation) -> int:
    """Signals are handled from the first moment (see ``_shutdown_on_signals``)."""
    shutdown, starting = asyncio.Event(), [True]
    reporter = RunReporter(inv.out)
    instance_id = inv.opt("instance_id") or default_dispatcher_id()
    with _shutdown_on_signals(shutdown, starting):
        try:
            spec = spec_of(inv)
            summary = await _dispatch(inv, spec, reporter, shutdown, starting)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if STOP_REQUESTED not in exc.args or task is None:
                raise
            task.uncancel()
            summary = RunSummary(shutdown_requested=True)
    reporter.finished(summary.as_dict(), instance_id)
    return EXIT_OK


async def _dispatch(
    inv: Invocation,
    spec: DispatchSpec,
    reporter: RunReporter,
    shutdown: asyncio.Event,
    starting: list[bool],
) -> RunSummary:
    with _metrics(inv) as (metrics, port):
        async with open_dispatcher(spec, metrics=metrics, prefetch=True) as dispatcher:
            reporter.started(_run_details(inv, spec, port))
            starting[0] = False  # from here on a signal lets the loop finish its round
            try:
                with _collector_for_rounds(), _prompt_thread_switches():
                    return await run(
                        spec,
                        dispatcher,
                        shutdown=shutdown,
                        max_iterations=inv.opt("max_iterations"),
                        on_iteration=lambda s, r: reporter.iteration(s.as_dict(), r.as_dict()),
                    )
            finally:
                reporter.stop()


# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms).
ROUND_SWITCH_INTERVAL_SECONDS = 0.001


@contextlib.contextmanager
def _prompt_thread_switches() -> Iterator[None]:
    """A shorter GIL switch interval for the run, as it was after.

    On SQLite the dispatcher commits its claim in aiosqlite's thread while the event
    loop decodes the claimed rows (``engine.dispatch.batches.Batches.claim``). That
    thread needs the GIL for a moment to start the commit; with the default interval it
    waited for the decoding to end, so nothing overlapped. With a shorter one the
    commit's fsync, which runs without the GIL, happens during the decoding (see
    decision 0021).
    """
    before = sys.getswitchinterval()
    sys.setswitchinterval(ROUND_SWITCH_INTERVAL_SECONDS)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


# Objects the cyclic collector's youngest generation may gain before it runs (default 700).
ROUND_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def _collector_for_rounds() -> Iterator[None]:
    """The cyclic garbage collector tuned for dispatch rounds, as it was after.

    What start-up made (modules, the apps, SQLAlchemy's tables and caches) lives as long
    as the process, yet every full collection walked it, often with many handlers in
    flight: frozen, it is left out. A round's own objects (rows, envelopes, outcomes)
    live until the round ends and are then freed by reference counting; at the default
    threshold the collector walked them several times a round before that, for nothing.
    Cycles still get collected, every ``ROUND_GC_THRESHOLD`` net allocations. See
    decision 0024.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(ROUND_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:  # the run is over: an in-process caller gets its collector back
        gc.set_threshold(*thresholds)
        gc.unfreeze()
