"""The CLI's async commands run on uvloop where it is installed (a dependency off Windows)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from outbox_tui.cli.event_loop import run_coroutine


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not a dependency on Windows")
def test_async_commands_run_on_uvloop() -> None:
    import uvloop

    async def running_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert isinstance(run_coroutine(running_loop()), uvloop.Loop)
