"""Writing events: the unit of work, the publisher, the event registry, domain events."""
