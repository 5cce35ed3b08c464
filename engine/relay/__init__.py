"""Relays that carry outbox events to a message broker (the dispatcher's external publisher)."""

from engine.errors import BrokerUnavailableError
from engine.relay.cloudevents import encode_cloudevent, to_cloudevent, traceparent_for
from engine.relay.rabbitmq import RabbitMqOutboxPublisher

__all__ = [
    "BrokerUnavailableError",
    "RabbitMqOutboxPublisher",
    "encode_cloudevent",
    "to_cloudevent",
    "traceparent_for",
]
