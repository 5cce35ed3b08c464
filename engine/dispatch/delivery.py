"""Delivering a round's rows to local handlers, at most ``max_concurrency`` at a time.

A pool of worker tasks takes the rows in claim order from one queue. The pool grows only
while every worker is inside a handler that is waiting: quick handlers that never wait
are run by one worker, so a no-op batch creates no tasks; handlers that await I/O reach
``max_concurrency`` workers within the batch's first calls (decision 0016).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

from engine.clock import Clock
from engine.dispatch.claimed import ClaimedRow, Outcome
from engine.dispatch.handler_timeouts import HandlerTimeouts
from engine.dispatch.handlers import HandlerRunner
from engine.writing.envelope import EventEnvelope


class OutcomeSink(Protocol):
    """Where a worker puts each outcome (the round's completions)."""

    def add(self, outcome: Outcome) -> None: ...


class LocalDelivery:
    """Starts a round's workers: ``runner`` runs each event's handlers; at most
    ``max_concurrency`` calls at once, counting ``calls_elsewhere()`` (the calls of the
    rounds finishing behind)."""

    def __init__(
        self,
        runner: HandlerRunner,
        *,
        max_concurrency: int,
        clock: Clock,
        calls_elsewhere: Callable[[], int],
    ) -> None:
        self.runner = runner
        self.max_concurrency = max_concurrency
        self.clock = clock
        self._calls_elsewhere = calls_elsewhere

    async def deliver(
        self,
        rows: list[ClaimedRow],
        envelopes: Mapping[str, EventEnvelope],
        *,
        deadline: datetime,
        stop: asyncio.Event | None,
        outcomes: OutcomeSink,
        on_waiting: Callable[[], None],
        hand_off: Callable[[int], bool] | None = None,
        progress: asyncio.Event | None = None,
    ) -> Workers | None:
        """Run the handlers of ``rows``; no event starts once ``stop`` is set or at
        ``deadline`` (it goes back unattempted).

        ``on_waiting`` is called once two handlers are mid-call at once: they wait. Once
        every row has started, ``hand_off(calls in flight)`` is asked (when ``progress``
        is set); if it agrees, the workers are returned still running (``finish()``
        awaits them), else None once they all are done.
        """
        done = await self.runner.succeeded(envelopes.values())
        clock = self.clock

        def must_not_start() -> bool:
            return (stop is not None and stop.is_set()) or clock() >= deadline

        workers = Workers(
            self.runner,
            rows,
            envelopes,
            done,
            HandlerTimeouts(self.runner.handler_timeout),
            outcomes,
            must_not_start,
            on_waiting,
            deadline,
            max_concurrency=self.max_concurrency,
            hand_off=hand_off,
            progress=progress or asyncio.Event(),
            others_in_calls=self._calls_elsewhere,
        )
        return workers if await workers.run() else None


class Workers:
    """The worker tasks of one round.

    A class, not a closure that starts copies of itself: such a closure names itself, a
    reference cycle that kept every round alive until the cyclic garbage collector ran.
    A finished round is freed by reference counting.
    """

    def __init__(
        self,
        runner: HandlerRunner,
        rows: list[ClaimedRow],
        envelopes: Mapping[str, EventEnvelope],
        done: set[tuple[str, str]],
        timeouts: HandlerTimeouts,
        outcomes: OutcomeSink,
        must_not_start: Callable[[], bool],
        on_waiting: Callable[[], None],
        deadline: datetime,
        *,
        max_concurrency: int,
        hand_off: Callable[[int], bool] | None,
        progress: asyncio.Event,
        others_in_calls: Callable[[], int],
    ) -> None:
        """Once ``must_not_start()``, rows left are handed back unattempted; ``on_waiting``
        is called when a second handler call starts while another is mid-call; after
        ``deadline`` an event's next handler does not start. ``others_in_calls()``: calls
        elsewhere that count against ``max_concurrency``. ``hand_off``/``progress``: see
        ``run``."""
        self._run_event = runner.for_round()  # watched when tracing or metrics are on
        self._queue = collections.deque(rows)
        self._envelopes = envelopes
        self._done = done
        self._timeouts = timeouts
        self._outcomes = outcomes
        self._max_concurrency = max_concurrency
        self._limit = min(max_concurrency, len(rows))
        self._tasks: list[asyncio.Task[None]] = []
        self._live = 0  # worker tasks not finished yet
        self._failed = False  # a worker raised: the round aborts
        self.in_calls = 0  # workers inside a handler call right now
        self._must_not_start = must_not_start
        self._on_waiting = on_waiting
        self._deadline = deadline
        self._hand_off = hand_off
        self._progress = progress
        self._others = others_in_calls

    async def run(self) -> bool:
        """Deliver every row (or hand it back). False: every worker has finished. True:
        every row has started and ``hand_off(calls in flight)`` agreed; the workers still
        in a call go on, and ``finish()`` awaits them. Woken by ``progress``: set when
        the last row is taken, when a worker ends, and by the caller (the claim ahead)."""
        self._spawn()
        try:
            while self._live and not self._failed:
                if not self._queue and self._hand_off is not None and self._hand_off(self.in_calls):
                    return True
                self._progress.clear()
                await self._progress.wait()
        except BaseException:
            await self._cancel_all()
            raise
        await self.finish()
        return False

    async def finish(self) -> None:
        """Wait for every worker (raising the first error); then stop the timeout watcher."""
        try:
            awaited = 0
            while awaited < len(self._tasks):  # the list grows while its first ones run
                await self._tasks[awaited]
                awaited += 1
        finally:
            if any(not task.done() for task in self._tasks):  # aborted: a worker raised
                await self._cancel_all()
            else:
                self._timeouts.close()

    async def _cancel_all(self) -> None:
        """Start nothing more, cancel every worker and wait for them: none outlives the
        round (no handler runs, nor outcome arrives, after it); then stop the watcher."""
        self._queue.clear()
        for task in self._tasks:
            task.cancel()
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._timeouts.close()

    def _spawn(self) -> None:
        self._live += 1
        self._tasks.append(asyncio.create_task(self._work()))

    async def _work(self) -> None:
        try:
            await self._take_rows()
        except BaseException:
            self._failed = True
            raise
        finally:
            self._live -= 1
            self._progress.set()

    async def _take_rows(self) -> None:
        me = asyncio.current_task()
        queue, outcomes = self._queue, self._outcomes
        while queue:
            row = queue.popleft()
            if not queue:
                self._progress.set()  # every row is taken: the round may hand off
            if self._must_not_start():
                outcomes.add(Outcome(row, "unattempted"))
                continue
            self.in_calls += 1
            if self.in_calls == 2:  # another handler is mid-call: it waits (on I/O)
                self._on_waiting()
            if self.in_calls == len(self._tasks) and queue and self._room():
                self._spawn()
            try:
                outcome = await self._run_event(
                    row,
                    self._envelopes[row.event_id],
                    self._done,
                    self._timeouts,
                    me,
                    self._deadline,
                )
            finally:
                self.in_calls -= 1
            outcomes.add(outcome)

    def _room(self) -> bool:
        """Whether one more worker fits within ``max_concurrency`` (with calls elsewhere)."""
        if len(self._tasks) >= self._limit:
            return False
        return len(self._tasks) + self._others() < self._max_concurrency
