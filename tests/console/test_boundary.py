"""The import boundary: the engine knows nothing of Textual or Rich; the console and the CLI
write no SQL."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_FILES = sorted(
    [
        *(ROOT / "outbox_tui").glob("app.py"),
        *(ROOT / "outbox_tui").glob("console.py"),
        *(ROOT / "outbox_tui").glob("demo.py"),
        *(ROOT / "outbox_tui").glob("dispatch_control.py"),
        *(ROOT / "outbox_tui").glob("messages.py"),
        *(ROOT / "outbox_tui").glob("actions.py"),
        *(ROOT / "outbox_tui").glob("output.py"),
        *(ROOT / "outbox_tui" / "cli").glob("*.py"),
        *(ROOT / "outbox_tui" / "screens").glob("*.py"),
        *(ROOT / "outbox_tui" / "widgets").glob("*.py"),
    ]
)
# What the console may take from SQLAlchemy: engine types and the pool class, no statements.
ALLOWED_SQLALCHEMY = {"sqlalchemy.ext.asyncio", "sqlalchemy.pool"}
# From the schema module: status names only, never a table to query.
ALLOWED_SCHEMA_NAMES = {"DEAD_LETTER", "PENDING", "PUBLISHED", "STATUSES"}


def test_importing_every_engine_module_pulls_in_no_textual_or_rich():
    script = (
        "import importlib, json, pkgutil, sys\n"
        "import engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('textual', 'rich'))\n"
        "print(json.dumps({'engine': len([n for n in sys.modules if n.startswith('engine')]),"
        " 'bad': bad}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    assert result["engine"] > 10  # the walk really imported the engine
    assert result["bad"] == []


def test_the_console_talks_to_the_engine_not_to_tables():
    assert len(CONSOLE_FILES) > 10
    problems = []
    for path in CONSOLE_FILES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                module, names = node.module, {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                module, names = node.names[0].name, set()
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if module.startswith("sqlalchemy") and module not in ALLOWED_SQLALCHEMY:
                problems.append(f"{where} imports {module}")
            if module in ("engine.store", "engine.heartbeat"):
                problems.append(f"{where} imports {module} (write paths)")
            if module == "engine.schema" and names - ALLOWED_SCHEMA_NAMES:
                problems.append(f"{where} imports tables {sorted(names - ALLOWED_SCHEMA_NAMES)}")
    assert problems == []
