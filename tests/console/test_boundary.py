"""The import boundary: the engine knows nothing of Textual or Rich; the console and the CLI
write no SQL."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "outbox_tui"
# Every module of the front ends, so a new one cannot escape the rule; the example app is a
# user's code (it writes its own business tables) and is exempt.
CONSOLE_FILES = sorted(
    path for path in PACKAGE.glob("**/*.py") if path.relative_to(PACKAGE).parts[0] != "examples"
)
# What the console may take from SQLAlchemy: engine types and the pool class, no statements.
ALLOWED_SQLALCHEMY = {"sqlalchemy.ext.asyncio", "sqlalchemy.pool"}
# From the schema module: status names only, never a table to query.
ALLOWED_SCHEMA_NAMES = {"DEAD_LETTER", "FAILED", "PENDING", "PUBLISHED", "STATUSES"}


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
                imports = [(node.module, {alias.name for alias in node.names})]
            elif isinstance(node, ast.Import):
                imports = [(alias.name, set()) for alias in node.names]
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            for module, names in imports:
                if module.startswith("sqlalchemy") and module not in ALLOWED_SQLALCHEMY:
                    problems.append(f"{where} imports {module}")
                if module.startswith("engine.dispatch.") or module == "engine.running.heartbeat":
                    problems.append(f"{where} imports {module} (write paths)")
                if module == "engine.storage.schema" and names - ALLOWED_SCHEMA_NAMES:
                    tables = sorted(names - ALLOWED_SCHEMA_NAMES)
                    problems.append(f"{where} imports tables {tables}")
    assert problems == []


def test_the_rule_covers_every_front_end_module_but_the_example_app():
    covered = {path.relative_to(PACKAGE).as_posix() for path in CONSOLE_FILES}
    for module in ("app.py", "entry.py", "output/writer.py", "cli/options.py", "screens/main.py"):
        assert module in covered
    assert not any(name.startswith("examples/") for name in covered)
    every = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.glob("**/*.py")}
    assert every - covered == {n for n in every if n.startswith("examples/")}


# No module grows past this, but the few named below: each says in a "Why one module"
# paragraph of its docstring why it is one, without a line count (counts go stale). A new
# exception is a change to this set, not a paragraph that lets a module pass unseen.
MODULE_LINES = 410
ONE_MODULE_EXCEPTIONS = {
    "engine/settings.py",  # the models, the loading and the error wording: one contract
    "engine/storage/schema.py",  # the tables and the predicates queries repeat word for word
}


def test_no_module_is_over_about_400_lines_but_the_named_exceptions():
    problems = []
    for path in sorted([*(ROOT / "engine").glob("**/*.py"), *PACKAGE.glob("**/*.py")]):
        name = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        lines = source.count("\n")
        docstring = ast.get_docstring(ast.parse(source)) or ""
        says_why = "Why one module" in docstring
        if name in ONE_MODULE_EXCEPTIONS:
            if not says_why:
                problems.append(f"{name}: an exception whose docstring does not say why")
        elif lines > MODULE_LINES:
            problems.append(f"{name}: {lines} lines")
        elif says_why:
            problems.append(f"{name}: a 'Why one module' paragraph, not in ONE_MODULE_EXCEPTIONS")
        if re.search(r"Why one module \([^)]*\blines?\b", docstring):
            problems.append(f"{name}: a line count in its 'Why one module' paragraph")
    assert problems == []
    assert all((ROOT / name).is_file() for name in ONE_MODULE_EXCEPTIONS)
