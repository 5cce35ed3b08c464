"""The recipes under docs/examples run: a FastAPI app (a unit of work per request) and a
Flask app (a sync unit of work), each writing an order and its event in one commit that a
dispatcher then delivers, on SQLite and PostgreSQL."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from engine import OutboxDispatcher, create_engine, create_schema
from engine.storage.schema import outbox_events
from tests.cli.conftest import Cli

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
HEADERS = {"X-Tenant": "acme", "X-User": "u-1", "X-Request-Id": "r-1"}

pytestmark = pytest.mark.all_drivers


@pytest.fixture
def recipes() -> Iterator[ModuleType]:
    """docs/examples importable as the recipes' README says to run them (from that folder);
    returns ``shop``, whose DELIVERED list the handler fills."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        shop = importlib.import_module("shop")
        shop.DELIVERED.clear()
        yield shop
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in ("shop", "fastapi_app", "flask_app"):
            sys.modules.pop(name, None)


async def counts(url: str) -> tuple[int, int]:
    """(orders, outbox events) in the database."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            events = (await conn.execute(select(func.count()).select_from(outbox_events))).scalar()
            orders = (await conn.execute(text("SELECT count(*) FROM shop_orders"))).scalar()
            return int(orders or 0), int(events or 0)
    finally:
        await engine.dispose()


async def deliver(url: str, shop: ModuleType) -> int:
    engine = create_engine(url)
    try:
        return (await OutboxDispatcher(engine, shop.shop_registry()).dispatch_once()).published
    finally:
        await engine.dispose()


async def test_fastapi_writes_order_and_event_per_request_and_a_dispatcher_delivers(
    database_url, recipes
):
    await create_schema(database_url)
    fastapi_app = importlib.import_module("fastapi_app")
    with TestClient(fastapi_app.create_app(database_url)) as client:
        placed = client.post("/orders", json={"order_id": "o-1", "amount": 42}, headers=HEADERS)
        assert placed.status_code == 201, placed.text
        refused = client.post("/orders", json={"order_id": "o-2", "amount": 0}, headers=HEADERS)
        assert refused.status_code == 422
        assert "amount" in refused.json()["detail"]
        assert client.post("/orders", json={"order_id": "o-3", "amount": 1}).status_code == 422
    assert await counts(database_url) == (1, 1)  # the refused request wrote neither
    assert await deliver(database_url, recipes) == 1
    delivered = recipes.DELIVERED
    assert delivered == [(placed.json()["event_id"], "o-1", 42)]


def _sync_url(database_url: str) -> str:
    url = make_url(database_url)
    name = "sqlite" if url.drivername.startswith("sqlite") else "postgresql+psycopg"
    return url.set(drivername=name).render_as_string(hide_password=False)


async def test_flask_writes_in_a_sync_unit_and_the_cli_dispatcher_delivers(
    database_url, recipes, tmp_path
):
    await create_schema(database_url)
    flask_app = importlib.import_module("flask_app")
    client = flask_app.create_app(_sync_url(database_url)).test_client()
    placed = client.post("/orders", json={"order_id": "o-1", "amount": 7}, headers=HEADERS)
    assert placed.status_code == 201, placed.text
    refused = client.post("/orders", json={"order_id": "o-2", "amount": -1}, headers=HEADERS)
    assert refused.status_code == 422
    assert await counts(database_url) == (1, 1)
    # The installed-app contract: the CLI's dispatcher serves docs/examples/shop.py.
    result = Cli(tmp_path)(
        "dispatch-once",
        "--installed-app",
        "shop",
        "--app-dir",
        str(EXAMPLES),
        "--json",
        "--database-url",
        database_url,
    )
    assert result.returncode == 0, result
    assert result.json()["published"] == 1
