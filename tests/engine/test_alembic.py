"""A service's own Alembic history owns the outbox schema: from nothing and from 0.1.

A real Alembic environment (env.py, two revisions: the service's table, then
``upgrade_outbox``) runs ``alembic upgrade head`` on an empty database and on one the
first release (0.1) made, then autogenerate finds nothing left to do, ``check_schema``
passes and a dispatcher drains the old rows and a new event.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy.engine import make_url

from engine import (
    ConfigurationError,
    OutboxDispatcher,
    OutboxEventPublisher,
    create_engine,
    create_sync_engine,
    metadata,
    unit_of_work,
)
from engine.storage.alembic_ops import include_object_for
from engine.storage.database import check_schema
from tests.old_schema import OLD_STATUSES, create_old_schema

from .conftest import CTX, order_payload

ENV_PY = """
from alembic import context
from sqlalchemy import Column, Integer, MetaData, String, Table

import engine
from engine.storage.alembic_ops import include_object_for

shop = MetaData()
Table("shop_orders", shop, Column("id", String(36), primary_key=True), Column("amount", Integer))
target_metadata = [shop, engine.metadata]


def run_migrations_online():
    connectable = engine.create_sync_engine(context.config.attributes["url"])
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_object=include_object_for(connection.dialect.name),
        )
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


def run_migrations_offline():
    context.configure(url=context.config.attributes["url"], target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
"""

SHOP_REVISION = '''
"""the service's own table"""
import sqlalchemy as sa
from alembic import op

revision = "0001_shop"
down_revision = None


def upgrade():
    op.create_table(
        "shop_orders",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("amount", sa.Integer),
    )
'''

OUTBOX_REVISION = '''
"""the outbox tables, at this outbox-tui version"""
from alembic import op

from engine.storage.alembic_ops import upgrade_outbox

revision = "0002_outbox"
down_revision = "0001_shop"


def upgrade():
    upgrade_outbox(op)
'''


@pytest.fixture(params=["sqlite", pytest.param("psycopg", marks=pytest.mark.postgresql)])
def urls(request, tmp_path) -> tuple[str, str]:
    """(async URL, sync URL for Alembic) of one fresh database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/shop.db", f"sqlite:///{tmp_path}/shop.db"
    async_url = request.getfixturevalue("pg_url")
    sync_url = make_url(async_url).set(drivername="postgresql+psycopg")
    return async_url, sync_url.render_as_string(hide_password=False)


@pytest.fixture
def alembic_config(tmp_path, urls) -> Config:
    root = tmp_path / "migrations"
    (root / "versions").mkdir(parents=True)
    (root / "env.py").write_text(textwrap.dedent(ENV_PY))
    (root / "versions" / "0001_shop.py").write_text(textwrap.dedent(SHOP_REVISION))
    (root / "versions" / "0002_outbox.py").write_text(textwrap.dedent(OUTBOX_REVISION))
    config = Config()
    config.set_main_option("script_location", str(root))
    config.attributes["url"] = urls[1]
    return config


def _outbox_only(_obj, name, type_, reflected, compare_to) -> bool:
    """The service's own tables (and Alembic's) are not the outbox's to compare."""
    return not (type_ == "table" and reflected and compare_to is None)


def autogenerate_diffs(sync_url: str) -> list[object]:
    """What autogenerate proposes for the outbox tables (``engine.metadata``)."""
    sync = create_sync_engine(sync_url)
    try:
        with sync.connect() as conn:
            hook = include_object_for(conn.dialect.name, and_then=_outbox_only)
            context = MigrationContext.configure(conn, opts={"include_object": hook})
            return list(compare_metadata(context, metadata))
    finally:
        sync.dispose()


async def drain(async_url: str, registry) -> tuple[list[str], str]:
    """Publish one new event, run a dispatcher round; (events handled, the new id)."""
    handled: list[str] = []

    @registry.handler("orders.placed", key="shop.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    engine = create_engine(async_url)
    try:
        await check_schema(engine)
        async with unit_of_work(engine, registry=registry, context=CTX) as session:
            new_id = await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-new"
            )
        result = await OutboxDispatcher(engine, registry).dispatch_once()
        assert result.published == result.claimed == len(handled)
    finally:
        await engine.dispose()
    return handled, new_id


async def test_an_alembic_history_creates_the_outbox_tables_on_an_empty_database(
    alembic_config, urls, registry
):
    async_url, sync_url = urls
    before = autogenerate_diffs(sync_url)
    added = {diff[1].name for diff in before if isinstance(diff, tuple) and diff[0] == "add_table"}
    assert set(metadata.tables) <= added  # autogenerate sees every outbox table
    command.upgrade(alembic_config, "head")
    assert autogenerate_diffs(sync_url) == []  # nothing left for autogenerate to propose
    command.check(alembic_config)  # `alembic check` agrees
    handled, new_id = await drain(async_url, registry)
    assert handled == [new_id]


async def test_an_alembic_history_upgrades_a_database_the_first_release_made(
    alembic_config, urls, registry
):
    async_url, sync_url = urls
    await create_old_schema(async_url)
    with pytest.raises(Exception, match="earlier version"):
        engine = create_engine(async_url)
        try:
            await check_schema(engine)
        finally:
            await engine.dispose()
    command.upgrade(alembic_config, "head")
    assert autogenerate_diffs(sync_url) == []
    handled, new_id = await drain(async_url, registry)
    assert len(handled) == OLD_STATUSES.count("pending") + 1 and new_id in handled


def test_offline_mode_is_refused_with_what_to_do_instead(alembic_config):
    with pytest.raises(ConfigurationError, match="init-db --sql"):
        command.upgrade(alembic_config, "head", sql=True)


def test_every_upgrade_step_is_offered_as_sql_to_paste(tmp_path: Path):
    """``init-db --sql`` statements, run by hand in a migration, make a 0.1 database
    current: tests/cli/test_init_db_modes.py runs them; here the module answers offline."""
    from engine.storage.migrations import new_schema_sql

    statements = new_schema_sql(f"sqlite+aiosqlite:///{tmp_path}/none.db")
    assert statements[0].startswith("CREATE TABLE")
    assert any("CREATE TRIGGER IF NOT EXISTS outbox_events_seq" in s for s in statements)
    assert not (tmp_path / "none.db").exists()
