"""outbox-tui: the operations console and command line for the outbox engine."""

__version__ = "0.1.0"
# The command's name in usage lines, errors and examples (one place; imported light).
PROG = "outbox-tui"
