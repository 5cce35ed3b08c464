"""A command on a pseudo-terminal, as a user runs it: for tests of the console's process
(the installed ``--demo``, its signals) that Textual's headless pilot cannot show."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def terminal(
    argv: list[str], *, cwd: Path, env: dict[str, str], size: tuple[int, int] = (160, 48)
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``argv`` on a pseudo-terminal of ``size`` (columns, rows); yields the process and the fd."""
    controller, terminal_fd = pty.openpty()
    columns, rows = size
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows)},
        stdin=terminal_fd,
        stdout=terminal_fd,
        stderr=terminal_fd,
        start_new_session=True,
    )
    os.close(terminal_fd)
    try:
        yield proc, controller
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(controller)


def read_until(fd: int, done: Callable[[bytes], bool], seconds: float) -> bytes:
    """What the terminal shows until ``done(output)``, it closes, or ``seconds`` pass."""
    output = b""
    deadline = time.monotonic() + seconds
    while not done(output) and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        output += chunk
    return output


def plain(screen: bytes) -> str:
    """Terminal output without its control sequences."""
    return re.sub(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]", b"", screen).decode(errors="replace")
