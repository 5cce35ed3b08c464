"""outbox-tui: the operations console and command line for the outbox engine."""

__version__ = "0.1.0"
# The command's name in usage lines, errors and examples (one place; imported light).
# engine.storage.database.PROGRAM is the same name for the engine's own hints (``outbox-tui
# init-db``); it is not imported from there because importing any engine module loads
# the whole engine (seconds), and outbox_tui.entry installs its SIGTERM handler before
# that. tests/cli/test_errors.py keeps the two equal.
PROG = "outbox-tui"
