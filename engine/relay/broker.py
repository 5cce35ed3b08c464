"""A RabbitMQ connection that reconnects on demand, with one channel its user sets up.

Reconnecting is done here, not by aio-pika's ``connect_robust``: a robust channel does
not wait for the reconnection and failed publishes are not replayed. Instead the user
asks for the live channel each time it needs it (``ensure``), and a connection or
channel found broken is replaced there; the user's own rhythm (the dispatcher's rounds)
paces the attempts. A failed connect is one ``BrokerUnavailableError`` with the password
masked, never a crash, and aiormq's connection-loss tracebacks are turned into one
DEBUG line.

What the channel is for is the user's: ``setup`` opens it on a fresh connection and
declares what it needs (the relay: a confirming channel and its exchange).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from aio_pika.abc import AbstractChannel, AbstractConnection
from aio_pika.connection import Connection, make_url

from engine.errors import BrokerUnavailableError, ConfigurationError
from engine.storage.secrets import mask_secrets, mask_url

T = TypeVar("T")

#: Opens the user's channel on a connection and declares what it needs; returns the
#: channel and what the user works with (the relay: its exchange).
ChannelSetup = Callable[[AbstractConnection], Awaitable[tuple[AbstractChannel, T]]]

_log = logging.getLogger(__name__)


def check_amqp_url(url: str) -> None:
    """Raise ``ConfigurationError`` unless ``url`` is an ``amqp://`` or ``amqps://`` URL."""
    if not url.startswith(("amqp://", "amqps://")):
        # Not echoed: without its scheme (user:pw@host) no mask finds the password.
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
        got = f"scheme {scheme.group(1)!r}" if scheme else "no scheme"
        raise ConfigurationError(f"RabbitMQ URL must start with amqp:// or amqps:// (it has {got})")
    try:
        _ = make_url(url).port  # parsed now: a bad URL is a configuration error, not an outage
    except ValueError as exc:
        raise ConfigurationError(f"invalid RabbitMQ URL {mask_url(url)!r}: {exc}") from None


class BrokerConnection(Generic[T]):
    """One connection and one channel, replaced when found broken.

    ``on_connect`` runs after every new connection (the relay ends an outage there).
    ``log``: the user's logger, for the connection's DEBUG lines. ``closed`` is set by
    ``close()`` and cleared by ``open()``; the user decides what it forbids.
    """

    def __init__(
        self,
        url: str,
        setup: ChannelSetup[T],
        *,
        connect_timeout: float,
        quiet_driver_logs: bool = True,
        on_connect: Callable[[], None] = lambda: None,
        log: logging.Logger = _log,
    ) -> None:
        check_amqp_url(url)
        self.url = url
        self.connect_timeout = connect_timeout
        self._setup = setup
        self._quiet = quiet_driver_logs
        self._on_connect = on_connect
        self._log = log
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._target: T | None = None
        self._broken = False
        self.closed = False
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    @property
    def is_open(self) -> bool:
        """True when the last known state of the channel is usable."""
        return self._target is not None and not self._broken and not self._channel_closed()

    def mark_broken(self) -> None:
        """The channel failed in use: the next ``ensure`` connects again."""
        self._broken = True

    async def open(self) -> T:
        """Connect unless connected (clears ``closed``); ``BrokerUnavailableError`` if not."""
        self.closed = False
        return await self.ensure()

    async def ensure(self) -> T:
        """The live channel's target, connecting again when the connection or channel broke."""
        async with self._lock:
            return await self._ensure()

    async def reopen(self) -> T:
        """The live channel's target, else a fresh channel: on the open connection when it
        can be had there, else on a new connection.

        After the broker closed a channel over one message, publish frames queued behind
        it reach the broker after the close, and the broker may then end the whole
        connection for them (``CHANNEL_ERROR - expected 'channel.open'``): a new
        connection is the answer to that, not an outage.
        """
        async with self._lock:
            if self.closed:
                raise BrokerUnavailableError("the connection to RabbitMQ is closed")
            if self.is_open:
                assert self._target is not None
                return self._target
            connection = self._connection
            if connection is None or connection.is_closed:
                self._broken = True
                return await self._ensure()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    channel, target = await self._setup(connection)
            except Exception as exc:
                self._log.debug("a fresh channel failed (%s); connecting again", self.detail(exc))
                self._broken = True
                return await self._ensure()
            channel.close_callbacks.add(self._on_channel_closed)
            self._channel, self._target, self._broken = channel, target, False
            return target

    async def close(self) -> None:
        """Close the connection and wait for every close begun in the background."""
        self.closed = True
        async with self._lock:
            await self._drop(wait=True)
        if self._closing:
            await asyncio.gather(*self._closing)

    def detail(self, exc: BaseException) -> str:
        """``Type: message`` of an error, with this connection's password masked."""
        text = str(exc).strip() or repr(exc)
        return mask_secrets(f"{type(exc).__name__}: {text}", self.url)

    async def _ensure(self) -> T:
        if self.is_open:
            assert self._target is not None
            return self._target
        await self._drop(wait=False)
        if self._quiet:
            quiet_driver_logs()
        # Built by hand rather than with aio_pika.connect(), so that a failed attempt can be
        # closed here (otherwise its __del__ leaves an un-awaited close() coroutine behind).
        connection: AbstractConnection = Connection(make_url(self.url))
        try:
            async with asyncio.timeout(self.connect_timeout):
                await connection.connect(timeout=self.connect_timeout)
                channel, target = await self._setup(connection)
        except Exception as exc:  # any failure here means "not connected", never a crash
            await self._close_quietly(connection)
            raise BrokerUnavailableError(
                f"cannot reach RabbitMQ at {self.masked_url}: {self.detail(exc)}"
            ) from None
        connection.close_callbacks.add(self._on_connection_closed)
        channel.close_callbacks.add(self._on_channel_closed)
        self._connection, self._channel, self._target = connection, channel, target
        self._broken = False
        self._on_connect()
        return target

    async def _drop(self, *, wait: bool) -> None:
        """Forget the connection and close it; in the background unless ``wait``.

        A broken connection can take long to close (a broker that stopped reading
        under a resource alarm), which must not delay the reconnect.
        """
        connection = self._connection
        self._connection = self._channel = self._target = None
        self._broken = False
        if connection is None:
            return
        connection.close_callbacks.discard(self._on_connection_closed)
        if wait:
            await self._close_quietly(connection)
        else:
            task = asyncio.create_task(self._close_quietly(connection))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, connection: AbstractConnection) -> None:
        """Close a connection that may already be dead, without raising."""
        try:
            async with asyncio.timeout(2.0):
                await connection.close()
        except Exception as exc:  # best effort: the connection is being thrown away
            self._log.debug("closing the RabbitMQ connection: %s", type(exc).__name__)

    def _channel_closed(self) -> bool:
        return self._channel is None or self._channel.is_closed

    def _on_connection_closed(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._connection:
            self._broken = True

    def _on_channel_closed(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._channel:
            self._broken = True


_DRIVER_NOISE = (
    "Unexpected connection close from remote",
    "Cancelling cause reader exited abnormally",
    "error when creating transport",
)


class _DriverNoiseFilter(logging.Filter):
    """Turns aiormq's connection-loss ERROR tracebacks into one DEBUG line of ours.

    The user reports an outage once (the relay: a WARNING with the failed and
    handed-back counts); aiormq's tracebacks repeat that on every reconnect try.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if not any(marker in message for marker in _DRIVER_NOISE):
            return True
        _log.debug("aiormq: %s", mask_secrets(message.splitlines()[0]))
        return False


_NOISE_FILTER = _DriverNoiseFilter()


def quiet_driver_logs() -> None:
    logger = logging.getLogger("aiormq.connection")
    if _NOISE_FILTER not in logger.filters:
        logger.addFilter(_NOISE_FILTER)
