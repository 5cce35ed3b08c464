"""A FastAPI service: one unit of work per request, the order and its event in one commit.

    pip install 'outbox-tui[psycopg]' fastapi uvicorn
    outbox-tui init-db --database-url "$DATABASE_URL"
    DATABASE_URL=postgresql+psycopg://app:secret@db/app uvicorn fastapi_app:app
    outbox-tui --dispatch --installed-app shop --app-dir docs/examples   # delivers them

A dependency opens the unit of work from the request's identity headers; the route writes
the order and publishes ``shop.order_placed`` through the same session. The dependency's
``scope="function"`` commits before the response is sent, so a failed commit is the
client's error, not a lost event. tests/examples/test_recipes.py runs it. (No ``from
__future__ import annotations`` here: FastAPI reads the route's annotations, and ``Unit``
is local to ``create_app``.)
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from shop import Base, Order, shop_registry
from sqlalchemy.ext.asyncio import AsyncSession

from engine import (
    EventValidationError,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    unit_of_work,
)


class NewOrder(BaseModel):
    order_id: str
    amount: int


def create_app(database_url: str) -> FastAPI:
    engine = create_engine(database_url)  # sqlite+aiosqlite, postgresql+asyncpg or +psycopg
    registry = shop_registry()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:  # the service's own table (outbox: init-db)
            await conn.run_sync(Base.metadata.create_all)
        yield
        await engine.dispose()

    async def unit(
        x_tenant: Annotated[str, Header()],
        x_user: Annotated[str, Header()],
        x_request_id: Annotated[str, Header()],
    ) -> AsyncIterator[AsyncSession]:
        context = TaskContext(tenant_id=x_tenant, actor_id=x_user, request_id=x_request_id)
        async with unit_of_work(engine, registry=registry, context=context) as session:
            yield session

    Unit = Annotated[AsyncSession, Depends(unit, scope="function")]
    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def place_order(new: NewOrder, session: Unit) -> dict[str, str]:
        session.add(Order(id=new.order_id, amount=new.amount))
        event_id = await OutboxEventPublisher(session).publish(
            "shop.order_placed",
            new.model_dump(),  # checked against OrderPlaced: amount must be > 0
            aggregate_type="order",
            aggregate_id=new.order_id,
        )
        return {"order_id": new.order_id, "event_id": event_id}

    @app.exception_handler(EventValidationError)
    async def refused(_request: Request, exc: EventValidationError) -> JSONResponse:
        # The unit of work rolled back: neither the order nor its event was written.
        return JSONResponse({"detail": str(exc)}, status_code=422)

    return app


app = create_app(os.environ.get("DATABASE_URL", "sqlite+aiosqlite:///./shop.db"))
