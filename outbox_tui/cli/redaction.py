"""Passwords never reach the terminal: every stream and log record goes through a redactor."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TextIO

from engine.storage.secrets import mask_secrets
from engine.tracing import TraceContextFilter
from outbox_tui.cli.log_format import JsonFormatter, TextFormatter
from outbox_tui.output import Output


class Redactor:
    """Removes the passwords of the URLs this run was given from any text it prints."""

    def __init__(self) -> None:
        self._urls: list[str] = []

    def add(self, url: str | None) -> None:
        if url:
            self._urls.append(url)

    def __call__(self, text: str) -> str:
        return mask_secrets(text, *self._urls)


class RedactingStream:
    """A text stream wrapper: everything written passes through the redactor first."""

    def __init__(self, inner: TextIO, redact: Callable[[str], str]) -> None:
        self._inner = inner
        self._redact = redact

    def write(self, text: str) -> int:
        self._inner.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._inner, "encoding", "utf-8")


class SecretFilter(logging.Filter):
    """Masks passwords in every log record (message, arguments and traceback text)."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self._redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self._redact(record.stack_info)
        return True


def configure_logging(level: str, out: Output, redact: Callable[[str], str]) -> None:
    """One handler on the root logger, on stderr, behind the secret filter: JSON lines in
    JSON mode, text lines otherwise (Rich's on a terminal); each with its trace ids."""
    handler: logging.Handler
    if out.json_mode:
        handler = logging.StreamHandler(out.err_console.file)
        handler.setFormatter(JsonFormatter())
    elif out.err_console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=out.err_console, show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(out.err_console.file)
        handler.setFormatter(TextFormatter())
    handler.addFilter(TraceContextFilter())
    handler.addFilter(SecretFilter(redact))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
