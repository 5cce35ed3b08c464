"""The fault suite (issue 9): real processes, real databases, a real broker, faults on purpose.

Each scenario records what it saw through ``tests.reliability.results.record``;
``python -m tests.reliability.report`` turns those records into docs/RELIABILITY.md.
Sizes are CI-sized by default; ``--soak`` (``make reliability``) runs them longer.
"""
