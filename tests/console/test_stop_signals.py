"""``outbox_tui.stop_signals`` in a process of its own: a stop signal reaches the app's
event loop when the loop is free, and ends the process after the grace period when the loop
is stuck (as on a terminal that went away, where Textual blocks on its writes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import asyncio, sys, time
from outbox_tui.stop_signals import StopSignals

async def main(stuck):
    stopped = asyncio.Event()
    stops = StopSignals(stopped.set, grace_seconds=1.5, stderr=sys.stderr)
    stops.install()
    print("ready", flush=True)
    if stuck:
        time.sleep(30)  # the loop never runs again: only the watchdog can end this
    await asyncio.wait_for(stopped.wait(), 30)
    stops.restore()
    print("stopped by", stops.received, flush=True)

asyncio.run(main(sys.argv[1] == "stuck"))
"""


def _run(mode: str, *signals: signal.Signals) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - started < 15
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_reaches_a_free_event_loop(sig: signal.Signals) -> None:
    done = _run("free", sig)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"stopped by {sig.name}\n", "")


def test_a_stuck_event_loop_is_ended_after_the_grace_period() -> None:
    started = time.monotonic()
    done = _run("stuck", signal.SIGTERM)
    assert done.returncode == 1
    assert time.monotonic() - started >= 1.5
    assert "SIGTERM received: the console did not stop within 1.5 s; exiting now" in done.stderr


def test_a_second_stop_signal_does_not_wait_for_the_grace_period() -> None:
    started = time.monotonic()
    done = _run("stuck", signal.SIGTERM, signal.SIGTERM)
    assert done.returncode == 1
    assert time.monotonic() - started < 1.5
