"""The console application and ``make_app``, the one factory the CLI, tests and screenshots use."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from textual import work
from textual.app import App

from engine.clock import Clock, utc_now
from engine.operating.insights import OutboxInsights
from engine.operating.replay import default_operator
from engine.operating.retention import inbound_window
from engine.service import DispatchSpec, insights_for, load_registry, open_engine
from engine.settings import DEFAULT_EXCHANGE, ConsoleSettings, DispatcherSettings, OutboxSettings
from engine.storage.secrets import mask_url
from engine.writing.registry import EventRegistry
from outbox_tui import PROG
from outbox_tui.actions import bindings
from outbox_tui.dispatch_control import DispatchControl, console_instance_id
from outbox_tui.screens.help import HelpScreen
from outbox_tui.screens.main import MainScreen
from outbox_tui.stop_signals import StopSignals
from outbox_tui.widgets.overview import AgeThresholds

DB_CALL_GRACE_SECONDS = 3.0
T = TypeVar("T")


def _settled(task: asyncio.Task[Any]) -> None:
    """Mark a database call's outcome as seen (its caller may have been cancelled)."""
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What the console was asked to show and how often."""

    database_url: str
    installed_apps: tuple[str, ...] = ()
    amqp_url: str | None = None
    exchange: str | None = None
    # The inbox's queue and bindings (OUTBOX_CONSUMER__*): the catalog says what it receives.
    queue: str | None = None
    bindings: tuple[str, ...] = ()
    amqp_probe_seconds: float = 1.0  # the relay's circuit breaker (engine.settings)
    amqp_max_probe_seconds: float = 30.0
    refresh_seconds: float = 1.0
    page_size: int = 100
    autostart_dispatch: bool = False
    stale_after_seconds: float = 30.0
    recent_window_seconds: float = 300.0
    poll_timeout_seconds: float = 10.0
    # How often the published total and the purge backlog are counted in full (off the
    # refresh path: they grow with the table; refreshes add what was published since).
    published_recount_seconds: float = 10.0
    pending_age: AgeThresholds = field(default_factory=AgeThresholds)
    dedup_window_seconds: float | None = None  # None: the default, 7 days
    trace_url_template: str | None = None  # the detail's link to a trace ({trace_id})
    # A line under the header, in wordings longest first (the demo says its failures are
    # deliberate); empty: none.
    note: tuple[str, ...] = ()


class BackgroundTraffic(Protocol):
    """Something the console runs beside itself (the demo's order generator)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class OutboxConsole(App[int]):
    """The operations console. Owns the services; ``MainScreen`` owns the views."""

    CSS_PATH = "styles.tcss"
    TITLE = PROG
    BINDINGS = bindings(app=True)
    # Every screen gets one width and one height class; styles.tcss fits the panels
    # and dialogs to 80x24 (narrow, short) up to 160x48 and beyond (wide, tall).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-medium"), (140, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]  # noqa: RUF012

    def __init__(
        self,
        config: ConsoleConfig,
        *,
        engine: AsyncEngine,
        insights: OutboxInsights,
        dispatch: DispatchControl,
        registry: EventRegistry,
        clock: Clock,
        traffic: BackgroundTraffic | None = None,
        operator: str | None = None,
        display_url: str | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.engine = engine
        self.insights = insights
        self.dispatch = dispatch
        self.registry = registry
        self.clock = clock
        self.traffic = traffic
        self.operator = operator or default_operator()
        self.display_url = display_url or mask_url(config.database_url)
        self._quitting = False
        self._db_calls: set[asyncio.Task[Any]] = set()
        self.stop_signals: StopSignals | None = None  # from mount on

    @property
    def main(self) -> MainScreen:
        return self._main

    @property
    def inbound_window(self) -> float:
        """How long inbound rows are kept, the inbox's dedup window: the dispatchers'
        setting, else the console's dedup window, else the default (7 days)."""
        given = self.dispatch.spec.settings.dispatcher.inbound_retention_seconds
        return inbound_window(given if given is not None else self.config.dedup_window_seconds)

    def db(self, call: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """Run one database call so that cancelling the caller does not abandon it.

        A worker cancelled mid-query (a newer refresh, the app quitting) would leave
        the driver's thread answering a loop that may be gone; the call finishes as
        its own task instead, and quitting waits briefly for such calls.
        """
        task = asyncio.ensure_future(call)
        self._db_calls.add(task)
        task.add_done_callback(_settled)
        task.add_done_callback(self._db_calls.discard)
        return asyncio.shield(task)

    def get_default_screen(self) -> MainScreen:
        self._main = MainScreen(self)
        return self._main

    async def on_mount(self) -> None:
        self.settle_collector()
        self._catch_stop_signals()
        if self.traffic is not None:
            await self.traffic.start()

    def _catch_stop_signals(self) -> None:
        """SIGTERM (``kill``, a service manager) and SIGHUP (the terminal went away) quit
        as ``q`` does (``outbox_tui.stop_signals``). Without this, SIGTERM unwound the app
        mid-batch and SIGHUP killed the process outright."""
        grace = self.dispatch.spec.settings.dispatcher.lease_seconds
        self.stop_signals = StopSignals(
            lambda: self.call_later(self.action_quit), grace_seconds=grace, stderr=sys.stderr
        )
        self.stop_signals.install()

    @property
    def stopped_by(self) -> str | None:
        """The signal that quit the console (SIGTERM, SIGHUP), if one did."""
        return self.stop_signals.received if self.stop_signals is not None else None

    def settle_collector(self) -> None:
        """Put the objects alive now out of the cyclic garbage collector's reach.

        Modules, widgets and the first screen's render caches live as long as the
        console, yet every full collection walks them all, the longest stalls of a
        running console. Frozen (on mount and after the first refresh), they are left
        out; quitting unfreezes them. See decision 0024.
        """
        gc.freeze()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.config.page_size))

    async def action_quit(self) -> None:
        if self.dispatch.running and not self._quitting:
            self._quitting = True
            self.notify(
                "Stopping the in-process dispatcher (its batch finishes first)…", markup=False
            )
            self.main.dispatch_state = "stopping"
            self._stop_then_exit()
            return
        self.exit(0)

    @work(group="quit", exit_on_error=False)
    async def _stop_then_exit(self) -> None:
        try:
            await self.dispatch.stop()
        finally:
            self.exit(0)

    async def on_unmount(self) -> None:
        if self.stop_signals is not None and self.stop_signals.received is None:
            self.stop_signals.restore()  # after a stop signal, run_console does (the watchdog)
        with contextlib.suppress(Exception):
            await self.dispatch.stop()
        if self._db_calls:
            await asyncio.wait(self._db_calls, timeout=DB_CALL_GRACE_SECONDS)
        if self.traffic is not None:
            with contextlib.suppress(Exception):
                await self.traffic.stop()
        try:
            await self.engine.dispose()
        finally:
            gc.unfreeze()


def make_app(
    config: ConsoleConfig,
    *,
    registry: EventRegistry | None = None,
    clock: Clock | None = None,
    dispatch_settings: DispatcherSettings | None = None,
    traffic: BackgroundTraffic | None = None,
    instance_id: str | None = None,
    operator: str | None = None,
    display_url: str | None = None,
) -> OutboxConsole:
    """Build the console; nothing connects until it runs.

    ``registry`` defaults to the ``installed_apps`` of ``config``; ``dispatch_settings``
    to ``load_settings().dispatcher`` (environment), which also gives the retention
    window behind "awaiting purge". ``clock`` is injected for deterministic screenshots.
    """
    registry = registry if registry is not None else load_registry(config.installed_apps)
    if dispatch_settings is None:
        from engine.settings import load_settings

        dispatch_settings = load_settings().dispatcher
    # The settings given once: what the dispatcher started by ``s`` and the counts use.
    settings = OutboxSettings.model_construct(
        database_url=config.database_url,
        amqp_url=config.amqp_url,
        exchange=config.exchange or DEFAULT_EXCHANGE,
        amqp_probe_seconds=config.amqp_probe_seconds,
        amqp_max_probe_seconds=config.amqp_max_probe_seconds,
        log_level=None,
        console=ConsoleSettings(
            refresh_seconds=config.refresh_seconds,
            page_size=config.page_size,
            trace_url_template=config.trace_url_template,
        ),
        dispatcher=dispatch_settings,
    )
    clock = clock or utc_now
    engine = open_engine(config.database_url, "console")
    insights = insights_for(
        engine,
        dispatch_settings,
        clock=clock,
        recent_window_seconds=config.recent_window_seconds,
        stale_after_seconds=config.stale_after_seconds,
    )
    spec = DispatchSpec(
        settings, registry, config.installed_apps, instance_id or console_instance_id()
    )
    return OutboxConsole(
        config,
        engine=engine,
        insights=insights,
        dispatch=DispatchControl(spec),
        registry=registry,
        clock=clock,
        traffic=traffic,
        operator=operator,
        display_url=display_url,
    )
