"""A billing service beside the orders example: one transactional handler, one event chain.

Load it with the orders app (``--installed-app outbox_tui.examples.orders
--installed-app outbox_tui.examples.billing``); the demo and the console's showcase do.
"""

from outbox_tui.examples.billing.app import Invoice, create_tables, issue_invoice, register

__all__ = ["Invoice", "create_tables", "issue_invoice", "register"]
