"""What a handler can lean on: its run records and at-most-once side effects."""
