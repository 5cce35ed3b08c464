"""outbox-tui: the operations console and command line for the outbox engine."""

__version__ = "0.1.0"
