"""Delivering events: claim a batch under a lease, run its handlers, write fenced outcomes."""
