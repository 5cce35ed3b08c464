"""The inbox (engine.inbox): decoding, rows, dedup, the consumer on real RabbitMQ."""
