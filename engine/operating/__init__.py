"""Operating the outbox: insights, error groups, pauses, replay, trends, retention."""
