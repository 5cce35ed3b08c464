"""SIGTERM and SIGHUP stop the console as ``q`` does, in a real process on a terminal: the
in-process dispatcher finishes its batch and its heartbeat says stopped, the command says
which signal stopped it and exits 0. Before, SIGTERM unwound the app mid-batch (and blamed
start-up) and SIGHUP, the terminal going away, killed it outright. A console whose event
loop is stuck is ended by the watchdog: tests/console/test_stop_signals.py."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from ..terminal import plain, read_until, terminal

pytestmark = pytest.mark.slow


def _heartbeats(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT instance_id, state FROM process_heartbeats"))
    finally:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_stops_the_console_and_its_dispatcher_cleanly(
    tmp_path: Path, sig: signal.Signals
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    db = tmp_path / "outbox-demo.db"
    argv = [sys.executable, "-m", "outbox_tui", "--demo"]
    with terminal(argv, cwd=tmp_path, env=env) as (proc, fd):
        # Its dispatcher is delivering once the dispatchers panel shows it alive.
        screen = read_until(fd, lambda out: b"1 alive of 1" in out, 90.0)
        assert b"1 alive of 1" in screen and proc.poll() is None, plain(screen)
        proc.send_signal(sig)
        said = f"{sig.name} received: the console stopped".encode()
        screen += read_until(fd, lambda out: said in out, 60.0)
        assert proc.wait(60) == 0, plain(screen)
    assert said.decode() in plain(screen)
    assert "start-up" not in plain(screen)
    assert set(_heartbeats(db).values()) == {"stopped"}  # not left alive, to go stale
