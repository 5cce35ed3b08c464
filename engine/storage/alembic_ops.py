"""The outbox schema inside a service's own Alembic migration history.

A service whose schema Alembic owns puts the outbox tables in its history instead of
running ``outbox-tui init-db``:

- ``upgrade_outbox(op)`` in a migration's ``upgrade()`` creates the outbox tables a
  database lacks and applies every upgrade step an earlier version's tables need (the
  same steps as ``init-db``, engine.storage.migrations), each through ``op.execute`` so
  Alembic logs it; on a current database it does nothing. Add a migration calling it
  whenever a new outbox-tui version reports the schema outdated (``init-db --check``).
- ``include_object_for(dialect)`` for ``context.configure(include_object=...)``: with
  ``engine.metadata`` in ``target_metadata``, autogenerate sees the outbox tables and
  leaves out the indexes of the other database (``ONLY_ON``), which it cannot tell apart.

Offline mode (``alembic upgrade --sql``) has no database to read: ``upgrade_outbox``
refuses it with one line; ``outbox-tui init-db --sql`` prints the SQL for a given
database instead, to paste into a migration as ``op.execute(...)``.

``alembic`` is an optional dependency (``pip install 'outbox-tui[alembic]'``); this
module only uses the ``op`` it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import ConfigurationError
from engine.storage.migrations import schema_sql
from engine.storage.schema import ONLY_ON

IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]


def upgrade_outbox(op: Any) -> list[str]:
    """Bring the outbox tables to this version's schema in the migration's transaction.

    Returns the statements run (empty on a current database).
    """
    if op.get_context().as_sql:
        raise ConfigurationError(
            "upgrade_outbox needs a database to read (Alembic's offline --sql mode has "
            "none): run `outbox-tui init-db --sql --database-url ...` against a database "
            "at the same version and put its statements in the migration"
        )
    statements = schema_sql(op.get_bind())
    for statement in statements:
        op.execute(statement)
    return statements


def include_object_for(dialect: str, and_then: IncludeObject | None = None) -> IncludeObject:
    """An Alembic ``include_object`` hook that leaves out outbox indexes ``dialect``'s
    databases do not have (SQLAlchemy's ``ddl_if``, which autogenerate does not read);
    ``and_then`` is your own hook, asked about everything else."""

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        if type_ == "index" and not reflected and ONLY_ON.get(str(name), dialect) != dialect:
            return False
        return and_then(obj, name, type_, reflected, compare_to) if and_then else True

    return include_object
