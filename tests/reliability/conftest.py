"""Fault-suite fixtures: the CLI runner of tests/cli (real ``python -m outbox_tui`` processes)."""

from tests.cli.conftest import cli  # noqa: F401 - shared fixture
