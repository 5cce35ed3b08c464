"""A small orders service: the outbox engine's example app and its plugin contract.

Load it into the CLI or the console with ``--installed-app outbox_tui.examples.orders``:
the CLI imports this module and calls ``register(registry)``.
"""

from outbox_tui.examples.orders.app import (
    Base,
    Order,
    OrderCancelled,
    OrderPlaced,
    cancel_order,
    create_tables,
    place_order,
    register,
)

__all__ = [
    "Base",
    "Order",
    "OrderCancelled",
    "OrderPlaced",
    "cancel_order",
    "create_tables",
    "place_order",
    "register",
]
