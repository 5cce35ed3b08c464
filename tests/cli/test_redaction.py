"""The secret filter every byte of output and every log record goes through (in-process)."""

from __future__ import annotations

import io
import logging
import sys

from rich.cells import cell_len

from engine import create_engine, create_schema, mask_url
from engine.operating.insights import OutboxInsights
from outbox_tui.cli import RedactingStream, Redactor, SecretFilter
from outbox_tui.output import Output
from outbox_tui.output.tables import stats_tables


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


def test_a_user_and_database_named_like_the_password_stay_readable() -> None:
    """Issue 43, defect 4: ``fv:fv@host/fv`` showed as ``***:***@host/***``."""
    url = "postgresql+asyncpg://fv:fv@host/fv"
    redact = redactor(url)
    assert redact(mask_url(url)) == "postgresql+asyncpg://fv:***@host/fv"
    assert redact(f"database {url}") == "database postgresql+asyncpg://fv:***@host/fv"
    # Standing alone, outside a URL, it is still a password.
    assert redact("login failed: password fv rejected") == "login failed: password *** rejected"


async def test_the_stats_table_fits_its_border_with_the_masked_url(tmp_path) -> None:
    """The table was laid out with ``fv:***@host/fv`` and printed, through the redactor,
    as ``***:***@host/***``: two characters wider than its border."""
    db = tmp_path / "fv.db"
    engine = create_engine(f"sqlite+aiosqlite:///{db}")
    try:
        await create_schema(engine)
        snapshot = await OutboxInsights(engine).overview()
    finally:
        await engine.dispose()
    url = "postgresql+asyncpg://fv:fv@host/fv"
    sink = io.StringIO()
    out = Output(json_mode=False, stdout=RedactingStream(sink, redactor(url)))  # type: ignore[arg-type]
    out.console.print(stats_tables(snapshot, mask_url(url), width=100)[0])
    lines = sink.getvalue().splitlines()
    assert any("postgresql+asyncpg://fv:***@host/fv" in line for line in lines)
    box = [line for line in lines if line[:1] in "┏┃┡│└┗┣├"]
    assert box and {cell_len(line) for line in box} == {cell_len(box[0])}, lines
