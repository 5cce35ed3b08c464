"""The fault suite's fixtures: the CLI tests' ``cli`` (a real ``outbox-tui`` subprocess)."""

from tests.cli.conftest import cli

__all__ = ["cli"]
