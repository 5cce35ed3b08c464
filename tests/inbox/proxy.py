"""A TCP proxy between a consumer and the broker that can hold back what the consumer sends.

Holding the consumer's side is how a test loses an ack exactly: the consumer commits its
batch and writes the ack, which stays here; killed then, its messages are redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib


class HoldingProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``hold()`` keeps the client's bytes."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.held = bytearray()
        self._holding = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def hold(self) -> None:
        self._holding = True

    async def close(self) -> None:
        """Drop every connection (what was held never reaches the broker)."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        self._writers += [client_w, server_w]
        for pump in (self._pump(client_r, server_w, upstream=True), self._pump(server_r, client_w)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool = False
    ) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                if upstream and self._holding:
                    self.held += data
                    continue
                writer.write(data)
                await writer.drain()
        writer.close()
