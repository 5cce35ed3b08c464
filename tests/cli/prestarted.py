"""Run ``python -m outbox_tui`` commands as children of one process that imported the CLI.

A fresh interpreter spends about 0.6 s of its 0.9 s start importing SQLAlchemy, pydantic,
rich and the engine; the suite runs several hundred short commands. Here one server
process per test process imports the CLI once and forks a child per command. The child
gets the command's own stdin/stdout/stderr, working directory, environment and
``sys.path`` (as ``python -m`` would build it from ``PYTHONPATH``), runs the same
``outbox_tui.entry.main`` as the script, and exits with its status. What it cannot show
is an import-time failure of the CLI itself: the wheel tests (tests/packaging) and every
``Cli.popen`` (signals, start-up) still start real interpreters, and
``OUTBOX_TEST_CLI_FRESH=1`` runs every command that way.

Run as a script, this module is the server: ``prestarted.py FD``, FD one end of a
SOCK_SEQPACKET socket pair. A request is one message (JSON ``argv``, ``cwd``, ``env``)
carrying the child's three standard descriptors; the answers are two messages, the
child's pid and then its exit status (``subprocess``'s returncode convention).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

_MAX_REQUEST = 1 << 20


class PrestartedCli:
    """The test process's side: starts the server on first use, one command at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._server: subprocess.Popen[bytes] | None = None

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> tuple[int, str, str]:
        """``(returncode, stdout, stderr)`` of the command; ``TimeoutExpired`` as ``run``."""
        with self._lock:
            sock = self._connected(env)
            with (
                open(os.devnull, "rb") as stdin,
                tempfile.TemporaryFile() as out,
                tempfile.TemporaryFile() as err,
            ):
                request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
                socket.send_fds(sock, [request], [stdin.fileno(), out.fileno(), err.fileno()])
                sock.settimeout(30)
                pid = _answer(sock)
                sock.settimeout(timeout)
                try:
                    code = _answer(sock)
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    sock.settimeout(30)
                    _answer(sock)  # the server reaped it
                    raise subprocess.TimeoutExpired(["outbox_tui", *argv], timeout) from None
                out.seek(0)
                err.seek(0)
                stdout = out.read().decode(errors="replace")
                stderr = err.read().decode(errors="replace")
            return code, stdout, stderr

    def _connected(self, env: dict[str, str]) -> socket.socket:
        if self._sock is not None and self._server is not None and self._server.poll() is None:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The interpreter flags of a command's environment (cli_env), without its
        # PYTHONPATH or OUTBOX_ settings: those are each child's own.
        server_env = {
            k: v for k, v in env.items() if k != "PYTHONPATH" and not k.startswith("OUTBOX_")
        }
        self._server = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=server_env,
            cwd=Path(__file__).parent,
        )
        theirs.close()
        self._sock = ours
        atexit.register(self.close)
        return ours

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server reads end-of-file and exits
            self._sock = None
        if self._server is not None:
            self._server.wait(timeout=10)
            self._server = None


def _answer(sock: socket.socket) -> int:
    message = sock.recv(64)
    if not message:
        raise RuntimeError("the prestarted CLI server exited (see its stderr above)")
    return int(message)


# -- the server process ------------------------------------------------------------------


def _serve(fd: int) -> None:
    # The imports every child shares.
    import outbox_tui.cli
    import outbox_tui.entry  # noqa: F401

    here = str(Path(__file__).parent)
    base_path = [p for p in sys.path if p not in ("", here)]
    conn = socket.socket(fileno=fd)
    while True:
        message, fds, _flags, _address = socket.recv_fds(conn, _MAX_REQUEST, 3)
        if not message:
            return  # the test process has gone
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(json.loads(message), fds, base_path)
        for received in fds:
            os.close(received)
        conn.send(str(pid).encode())
        _, status = os.waitpid(pid, 0)
        conn.send(str(os.waitstatus_to_exitcode(status)).encode())


def _child(request: dict[str, Any], fds: list[int], base_path: list[str]) -> None:
    """Become the command: its descriptors, directory, environment and path; never returns."""
    code: Any = 1
    try:
        for target, received in zip((0, 1, 2), fds, strict=True):
            os.dup2(received, target)
            os.close(received)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *base_path]
        import outbox_tui.__main__ as script
        from outbox_tui.entry import main

        sys.argv = [str(script.__file__), *request["argv"]]
        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if code is None:
            code = 0
        elif not isinstance(code, int):  # sys.exit("message"), as the interpreter does
            print(code, file=sys.stderr)
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
