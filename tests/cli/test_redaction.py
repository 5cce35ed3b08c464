"""The secret filter every byte of output and every log record goes through (in-process)."""

from __future__ import annotations

import io
import logging
import sys

from outbox_tui.cli import RedactingStream, Redactor, SecretFilter


def redactor(*urls: str) -> Redactor:
    redact = Redactor()
    for url in urls:
        redact.add(url)
    return redact


def test_masks_urls_and_a_password_standing_alone() -> None:
    redact = redactor("postgresql+asyncpg://app:s3cr%40t@db/app", "amqp://bus:hunter2@mq/")
    text = redact(
        "connect postgresql+asyncpg://app:s3cr%40t@db/app failed (password 's3cr@t'); "
        "broker amqp://bus:hunter2@mq/ said hunter2 is wrong; raw s3cr%40t"
    )
    for secret in ("s3cr@t", "s3cr%40t", "hunter2"):
        assert secret not in text
    assert "postgresql+asyncpg://app:***@db/app" in text
    assert "amqp://bus:***@mq/" in text


def test_a_common_password_does_not_mangle_words() -> None:
    redact = redactor("postgresql+asyncpg://app:postgres@db/app")
    assert redact("use postgresql; password: postgres") == "use postgresql; password: ***"


def test_streams_and_log_records_are_redacted() -> None:
    redact = redactor("postgresql+asyncpg://app:topsecret@db/app")
    sink = io.StringIO()
    RedactingStream(sink, redact).write("url postgresql+asyncpg://app:topsecret@db/app\n")
    assert "topsecret" not in sink.getvalue()

    try:
        raise RuntimeError("password topsecret rejected")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "t", logging.ERROR, __file__, 1, "login %s failed", ("topsecret",), exc_info
    )
    assert SecretFilter(redact).filter(record)
    assert record.getMessage() == "login *** failed"
    assert record.exc_text is not None and "topsecret" not in record.exc_text
