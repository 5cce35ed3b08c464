"""The package as a user installs it: built, installed into a fresh venv, run outside the tree.

`make test` runs from an editable install, which reads the checkout: a stylesheet missing
from the wheel, or an extra top-level package in it, goes unnoticed there. These tests copy
the sources (without build leftovers, so a stale ``*.egg-info`` or ``build/`` cannot add
files), build the sdist and, from that sdist, the wheel (``python -m build``), install the
wheel with its dependencies into a new venv in a temporary directory, and run the command
line, the console (headless, through Textual's pilot) and ``--demo`` (under a pseudo-terminal)
from there, with the working directory outside the checkout and no ``PYTHONPATH``.

Dependencies come from the package index pip is configured with (``PIP_INDEX_URL``,
``PIP_FIND_LINKS`` ... apply); the build, venv and install take about half a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import outbox_tui

from ..terminal import plain, read_until, terminal

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "outbox_tui")
APP = "outbox_tui.examples.orders"
# Never part of a source copy: what .gitignore keeps out of the repository.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "venv", "*.egg-info", "build", "dist", "__pycache__", "*.pyc",
    ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.db", "*.db-wal", "*.db-shm",
    "snapshot_report.html", ".hypothesis", "results",
)  # fmt: skip
# What the venv's processes must not inherit: anything that points back into the checkout.
NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")


def clean_env() -> dict[str, str]:
    """This process's environment without Python path settings and ``OUTBOX_`` settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in NOT_INHERITED and not k.startswith("OUTBOX_")
    }


def run(
    cmd: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; fail the test with its output unless it exits 0."""
    done = subprocess.run(
        [str(part) for part in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {done.returncode}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    return done


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    root: Path
    work: Path  # an empty working directory outside the checkout

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def env(self) -> dict[str, str]:
        env = clean_env()
        env.update(
            PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            PYTHONNOUSERSITE="1",
            NO_COLOR="1",
            COLUMNS="200",
        )
        return env

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the installed ``outbox-tui`` command."""
        return run([self.bin / "outbox-tui", *args], cwd=self.work, env=self.env, timeout=timeout)

    def python(self, script: str, *args: str, timeout: float = 120) -> str:
        """Run ``script`` with the venv's interpreter; its stdout."""
        cmd = [self.bin / "python", "-c", textwrap.dedent(script), *args]
        return run(cmd, cwd=self.work, env=self.env, timeout=timeout).stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """An sdist built from a clean copy of the sources, and the wheel built from that sdist."""
    tmp = tmp_path_factory.mktemp("dists")
    assert ROOT not in tmp.parents, "the build must happen outside the checkout"
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp / "dist"
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*.
    build = [sys.executable, "-m", "build", "--outdir", out, source]
    run(build, cwd=tmp, env=clean_env(), timeout=600)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dists(sdist=sdist, wheel=wheel)


@pytest.fixture(scope="module")
def venv(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv (no system site-packages) with the wheel and its dependencies installed."""
    tmp = tmp_path_factory.mktemp("installed")
    work = tmp / "work"
    work.mkdir()
    env = Venv(tmp / "venv", work)
    run([sys.executable, "-m", "venv", env.root], cwd=work, env=env.env, timeout=300)
    run([env.bin / "python", "-m", "pip", "install", "--quiet", dists.wheel],
        cwd=work, env=env.env, timeout=900)  # fmt: skip
    return env


def test_the_wheel_holds_its_own_packages_and_everything_they_read(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    version = re.escape(outbox_tui.__version__)
    own = re.compile(rf"^(engine|outbox_tui|outbox_tui-{version}\.(dist-info|data))$")
    tops = sorted({name.split("/")[0] for name in names})
    assert [top for top in tops if not own.match(top)] == [], (
        "the wheel may install only engine/ and outbox_tui/"
    )
    # Every module and stylesheet of the packages, plus the typing marker.
    expected = {"engine/py.typed", "outbox_tui/styles.tcss"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".tcss") and "__pycache__" not in path.parts:
                expected.add(path.relative_to(ROOT).as_posix())
    missing = sorted(expected - names)
    assert missing == [], f"not in the wheel (declare it as package data): {missing}"
    assert "outbox_tui/examples/orders/app.py" in names
    # The wheel came from the sdist, but check the sdist itself carries the data files too.
    with tarfile.open(dists.sdist) as sdist:
        in_sdist = {name.split("/", 1)[-1] for name in sdist.getnames()}
    assert {"engine/py.typed", "outbox_tui/styles.tcss", "README.md"} <= in_sdist
    text = metadata.decode()
    assert "Description-Content-Type: text/markdown" in text
    assert "Classifier: Typing :: Typed" in text
    assert "Requires-Python: >=3.11" in text


def test_it_is_installed_in_the_venv_not_read_from_the_checkout(venv: Venv) -> None:
    found = json.loads(
        venv.python(
            """
            import json, sys
            import engine, outbox_tui, outbox_tui.examples.orders
            print(json.dumps({"files": [engine.__file__, outbox_tui.__file__,
                                        outbox_tui.examples.orders.__file__],
                              "path": sys.path}))
            """
        )
    )
    site = venv.root.resolve()
    for file in found["files"]:
        assert site in Path(file).resolve().parents, file
    assert [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)] == []
    leaked = sorted(str(p) for p in site.glob("lib/*/site-packages/__editable__*"))
    assert leaked == []
    assert not list(site.glob("lib/*/site-packages/examples"))


def test_the_installed_command_line_works_on_sqlite(venv: Venv) -> None:
    url = f"sqlite+aiosqlite:///{venv.work / 'cli.db'}"
    version = venv("--version").stdout.strip()
    assert version == f"outbox-tui {outbox_tui.__version__}"
    assert json.loads(venv("init-db", "--database-url", url, "--json").stdout)["schema"] in (
        "created",
        "present",
    )
    venv.python(
        """
        import asyncio, sys
        from engine import create_engine
        from engine.service import load_registry
        from outbox_tui.examples.orders import create_tables
        from outbox_tui.examples.orders.traffic import generate_orders

        async def main(url):
            engine = create_engine(url)
            try:
                await create_tables(engine)
                await generate_orders(engine, load_registry(["outbox_tui.examples.orders"]), 20)
            finally:
                await engine.dispose()

        asyncio.run(main(sys.argv[1]))
        """,
        url,
    )
    common = ("--database-url", url, "--installed-app", APP, "--json")
    round_ = json.loads(venv("dispatch-once", *common).stdout)
    # 20 orders placed, every 5th cancelled; ordered by order, so a cancellation waits
    # behind its order's placed event: the first round takes the 20 heads.
    assert round_["claimed"] == 20
    stats = json.loads(venv("stats", *common).stdout)
    counts = stats["counts"]
    assert stats["total"] == 24 and counts["pending"] == 4
    assert counts["published"] > 0 and counts["failed"] > 0 and counts["dead_letter"] > 0
    assert round_["published"] == counts["published"]
    # Installed as a user installs it: OpenTelemetry's API only, no SDK. Nothing is traced
    # and no row gets a stored trace context (tests/tracing has the SDK).
    untraced = venv.python(
        """
        import importlib.util, sqlite3, sys
        assert importlib.util.find_spec("opentelemetry.trace") is not None
        assert importlib.util.find_spec("opentelemetry.sdk") is None
        with sqlite3.connect(sys.argv[1]) as db:
            print(db.execute("SELECT count(traceparent) FROM outbox_events").fetchone()[0])
        """,
        str(venv.work / "cli.db"),
    )
    assert untraced.strip() == "0"
    dead = json.loads(venv("dead-letter", "list", *common).stdout)
    assert len(dead) == counts["dead_letter"]
    assert {row["event_type"] for row in dead} <= {"orders.placed", "orders.cancelled"}


def test_the_installed_console_shows_its_first_screen(venv: Venv) -> None:
    url = f"sqlite+aiosqlite:///{venv.work / 'console.db'}"
    venv("init-db", "--database-url", url)
    seen = json.loads(
        venv.python(
            """
            import asyncio, json, sys, time
            from outbox_tui.app import ConsoleConfig, make_app

            async def main(url):
                config = ConsoleConfig(url, installed_apps=("outbox_tui.examples.orders",),
                                       refresh_seconds=0.2)
                app = make_app(config)
                async with app.run_test(size=(160, 48)) as pilot:
                    health = lambda: str(app.screen.query_one("#health").render())
                    deadline = time.monotonic() + 60  # a fresh venv on a loaded machine
                    while time.monotonic() < deadline:
                        if app.main.refreshes > 0 and "first refresh" not in health():
                            break
                        await pilot.pause(0.05)
                    await pilot.pause(0.2)
                    tiles = {w.id: str(w.render()) for w in app.screen.query(".tile")}
                    print(json.dumps({
                        "screen": type(app.screen).__name__,
                        "refreshes": app.main.refreshes,
                        "css_path": [str(p) for p in app.css_path],
                        "tiles_height": str(app.screen.query_one("#tiles").styles.height),
                        "tiles": tiles,
                        "health": str(app.screen.query_one("#health").render()),
                    }))

            asyncio.run(main(sys.argv[1]))
            """,
            url,
            timeout=120,
        )
    )
    assert seen["screen"] == "MainScreen" and seen["refreshes"] > 0
    (css,) = seen["css_path"]
    assert Path(css).is_relative_to(venv.root) and Path(css).is_file()
    assert seen["tiles_height"] == "4"  # a rule from styles.tcss is in force
    assert {"tile-pending", "tile-dead_letter", "tile-published"} <= set(seen["tiles"])
    assert seen["tiles"]["tile-pending"].strip() == "0"
    assert "waiting for the first refresh" not in seen["health"]


def test_the_installed_demo_runs_in_a_terminal(venv: Venv) -> None:
    with terminal([str(venv.bin / "outbox-tui"), "--demo"], cwd=venv.work, env=venv.env) as (
        proc,
        fd,
    ):
        # The first screen, then a few seconds of the live demo (traffic, dispatcher, refresh).
        screen = read_until(fd, lambda out: b"pending" in out.lower(), 30.0)
        screen += read_until(fd, lambda out: False, 3.0)
        assert proc.poll() is None, f"--demo exited {proc.returncode}:\n{plain(screen)}"
        os.write(fd, b"q")
        screen += read_until(fd, lambda out: False, 10.0)  # until it closes the terminal
        status = proc.wait(15)
    text = plain(screen)
    assert status == 0, text
    assert "Traceback" not in text and "StylesheetError" not in text
    assert "outbox-tui" in text and "pending" in text.lower()
    assert (venv.work / "outbox-demo.db").is_file()


@pytest.mark.postgresql
def test_the_installed_wheel_publishes_and_drains_on_psycopg(
    venv: Venv, dists: Dists, psycopg_url: str
) -> None:
    """Issue 47, as a new user tries it: the wheel with its ``psycopg`` extra, a service's
    engine on ``postgresql+psycopg://``, an order published in its transaction, then drained."""
    run([venv.bin / "python", "-m", "pip", "install", "--quiet", f"{dists.wheel}[psycopg]"],
        cwd=venv.work, env=venv.env, timeout=600)  # fmt: skip
    common = ("--database-url", psycopg_url, "--installed-app", APP, "--json")
    venv("init-db", "--database-url", psycopg_url)
    venv.python(
        """
        import asyncio, sys
        from engine import TaskContext, create_engine
        from engine.service import load_registry
        from outbox_tui.examples.orders import create_tables, place_order

        async def main(url):
            engine = create_engine(url)
            try:
                await create_tables(engine)
                registry = load_registry(["outbox_tui.examples.orders"])
                await place_order(engine, registry, TaskContext("acme", "wheel", "r-1"), "ann", 120)
            finally:
                await engine.dispose()

        asyncio.run(main(sys.argv[1]))
        """,
        psycopg_url,
    )
    round_ = json.loads(venv("dispatch-once", *common).stdout)
    assert round_["claimed"] == 1 and round_["published"] == 1
    stats = json.loads(venv("stats", *common).stdout)
    assert stats["counts"]["published"] == 1 and stats["total"] == 1
    assert "postgresql+psycopg://" in stats["database_url"] and "***" in stats["database_url"]
