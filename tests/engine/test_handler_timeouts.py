"""HandlerTimeouts: one watcher cancels each call that runs past the limit, and only it."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.dispatch.handler_timeouts import HandlerTimedOut, HandlerTimeouts

LIMIT = 1.0  # far above the 0.01 s calls that must pass, on a loaded machine too


async def _sleep_then(seconds: float, value: str) -> str:
    await asyncio.sleep(seconds)
    return value


async def test_a_call_within_the_limit_returns_its_value() -> None:
    timeouts = HandlerTimeouts(LIMIT)
    try:
        assert await timeouts.run(_sleep_then(0.01, "done")) == "done"
    finally:
        timeouts.close()


async def test_a_call_past_the_limit_times_out_and_leaves_its_task_uncancelled() -> None:
    timeouts = HandlerTimeouts(LIMIT)
    started = time.monotonic()
    try:
        with pytest.raises(HandlerTimedOut):
            await timeouts.run(_sleep_then(30, "never"))
        assert time.monotonic() - started >= LIMIT
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        # The worker goes on with its next call, which the timeout does not touch.
        assert await timeouts.run(_sleep_then(0.01, "next")) == "next"
    finally:
        timeouts.close()


async def test_each_call_is_timed_from_its_own_start() -> None:
    timeouts = HandlerTimeouts(2.0)

    async def late_start(delay: float, seconds: float) -> str:
        await asyncio.sleep(delay)
        try:
            return await timeouts.run(_sleep_then(seconds, "ok"))
        except HandlerTimedOut:
            return "timed out"

    try:
        results = await asyncio.gather(
            late_start(0.0, 30),  # the first deadline: it times out
            late_start(1.8, 0.6),  # ends at 2.4 s, past the first deadline, within its own
            late_start(0.4, 30),
            late_start(0.0, 0.01),
        )
    finally:
        timeouts.close()
    assert results == ["timed out", "ok", "timed out", "ok"]


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    timeouts = HandlerTimeouts(30)
    try:
        call = asyncio.ensure_future(timeouts.run(_sleep_then(30, "never")))
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        timeouts.close()


async def test_a_call_that_swallows_the_cancellation_returns_and_is_not_left_cancelling() -> None:
    timeouts = HandlerTimeouts(LIMIT)

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "never"

    try:
        assert await timeouts.run(stubborn()) == "swallowed"
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # no cancellation is left pending for this task
    finally:
        timeouts.close()
