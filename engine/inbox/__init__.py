"""The inbox: events from RabbitMQ become rows of this service's outbox, once each.

A consumer turns each CloudEvent it takes off a queue into an ``outbox_events`` row
(``rows``), deduplicated by its CloudEvents (source, id) through a unique index
(``writer``), in batches committed before they are acked; from there the service's own
dispatchers deliver them like local events. ``decoding`` reads structured and binary
content mode; a message that cannot be read becomes a dead-lettered row that keeps its
raw body. See docs/inbox.md.
"""

from engine.inbox.decoding import (
    Decoded,
    InboundEvent,
    ReceivedMessage,
    Undecodable,
    decode_message,
)
from engine.inbox.rows import UNDECODABLE_TYPE, InboundRow, RowBuilder
from engine.inbox.writer import InboxWriter, WriteResult

__all__ = [
    "UNDECODABLE_TYPE",
    "Decoded",
    "InboundEvent",
    "InboundRow",
    "InboxWriter",
    "ReceivedMessage",
    "RowBuilder",
    "Undecodable",
    "WriteResult",
    "decode_message",
]
