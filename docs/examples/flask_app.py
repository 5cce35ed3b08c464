"""A Flask service (sync): one sync unit of work per request, the order and its event in one
commit, for a dispatcher to deliver.

    pip install 'outbox-tui[psycopg]' flask
    outbox-tui init-db --database-url postgresql+psycopg://app:secret@db/app
    DATABASE_URL=postgresql+psycopg://app:secret@db/app flask --app flask_app run
    outbox-tui --dispatch --installed-app shop --app-dir docs/examples   # delivers them

The same works from a Celery task or a script: open ``sync_unit_of_work`` on a sync
engine (``sqlite:///``, ``postgresql+psycopg://``, ``postgresql+psycopg2://``) and publish
through its session. tests/examples/test_recipes.py runs it.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, request
from shop import Base, Order, shop_registry

from engine import (
    EventValidationError,
    SyncOutboxEventPublisher,
    TaskContext,
    create_sync_engine,
    sync_unit_of_work,
)


def create_app(database_url: str) -> Flask:
    engine = create_sync_engine(database_url)
    Base.metadata.create_all(engine)  # the service's own table (the outbox's: init-db)
    registry = shop_registry()
    app = Flask(__name__)

    @app.post("/orders")
    def place_order() -> tuple[dict[str, Any], int]:
        body = request.get_json()
        context = TaskContext(
            tenant_id=request.headers["X-Tenant"],
            actor_id=request.headers["X-User"],
            request_id=request.headers["X-Request-Id"],
        )
        try:
            with sync_unit_of_work(engine, registry=registry, context=context) as session:
                session.add(Order(id=body["order_id"], amount=body["amount"]))
                event_id = SyncOutboxEventPublisher(session).publish(
                    "shop.order_placed",
                    {"order_id": body["order_id"], "amount": body["amount"]},
                    aggregate_type="order",
                    aggregate_id=body["order_id"],
                )
        except EventValidationError as exc:  # rolled back: no order, no event
            return {"detail": str(exc)}, 422
        return {"order_id": body["order_id"], "event_id": event_id}, 201

    return app


if __name__ == "__main__":
    create_app(os.environ.get("DATABASE_URL", "sqlite:///./shop.db")).run()
