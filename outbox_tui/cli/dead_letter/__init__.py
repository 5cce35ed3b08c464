"""``outbox-tui dead-letter list|groups|replay|skip``: inspect dead letters and act on them.

One command group (docs/cli.md documents it together), one module per action:
``listing`` (list, groups), ``replay`` and ``skip``; ``options`` has the options they
share. The checks and the changes come from ``engine.service``, the same code
the console's ``r``, ``R`` and ``k`` run.
"""

from __future__ import annotations

from typing import Any

from outbox_tui import PROG
from outbox_tui.cli.dead_letter import listing, replay, skip
from outbox_tui.cli.options import Parser, subparser


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "dead-letter",
        "list, replay or skip dead-letter events",
        "Inspect and replay events that exhausted their attempts or failed permanently, "
        "or skip the ones that hold back their ordering key.",
        f"{PROG} dead-letter list --json",
        f"{PROG} dead-letter groups",
        f"{PROG} dead-letter replay --group 3978ad63b895 --yes --reason 'vendor back'",
        f"{PROG} dead-letter replay --event-id 0190... --yes --reason 'fixed the bug'",
        f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
    )
    inner = p.add_subparsers(dest="dead_letter_command", metavar="ACTION", parser_class=Parser)
    inner.required = True
    listing.register_list(inner)
    listing.register_groups(inner)
    replay.register(inner)
    skip.register(inner)
