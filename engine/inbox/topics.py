"""Bindings as ``consume`` takes them (``EXCHANGE:ROUTING_KEY``) and topic matching.

The broker binds the inbox's queue with them (``engine.inbox.broker``); the catalog
(``engine.service.catalog``) matches them against the registered event types, which the
relay publishes with the type as routing key. One parser, one matcher: what the catalog
says the queue receives is what RabbitMQ routes to it.
"""

from __future__ import annotations


def split_binding(binding: str) -> tuple[str, str]:
    """``("outbox.events", "orders.#")`` for ``outbox.events:orders.#`` (the exchange is
    before the first colon: an exchange name has none, a routing key may)."""
    exchange, _, routing_key = binding.partition(":")
    return exchange, routing_key


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic exchange routes ``routing_key`` to a binding by ``pattern``:
    words are separated by ``.``, ``*`` stands for exactly one word, ``#`` for zero or
    more."""
    return _matches(pattern.split("."), routing_key.split("."))


def _matches(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_matches(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _matches(rest, words[1:])
