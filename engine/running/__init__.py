"""Running dispatchers: the run loop, heartbeats, locks, wake-ups and metrics."""
