"""Example applications that use the outbox engine."""
