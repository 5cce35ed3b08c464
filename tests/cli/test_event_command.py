"""``outbox-tui event ID``: one event's detail, with its cause and chain, as text or JSON."""

from __future__ import annotations

import json

from tests.chains import chain_registry, seed_chain

from .conftest import Cli


async def a_chain(url: str) -> tuple[str, str]:
    return await seed_chain(url, chain_registry())


async def test_an_event_shows_its_cause_and_chain_as_json_and_as_text(database_url: str, cli: Cli):
    first, follow_up = await a_chain(database_url)
    env = {"OUTBOX_DATABASE_URL": database_url}
    done = cli("event", follow_up, "--json", env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["id"] == follow_up and record["event_type"] == "invoices.issued"
    assert (record["causation_id"], record["correlation_id"]) == (first, first)
    assert record["chain_id"] == first
    assert [(e["id"], e["causation_id"]) for e in record["chain"]] == [
        (first, None),
        (follow_up, first),
    ]
    assert record["payload"]["tenant_id"] == "acme"
    assert record["created_at"].endswith("Z")
    text = cli("event", follow_up, env=env)
    assert text.returncode == 0, text.stderr
    assert "Chain (2 events)" in text.stdout and "◀ this event" in text.stdout
    assert first in text.stdout


async def test_an_unknown_event_is_one_line_and_a_failure(sqlite_url: str, cli: Cli):
    await a_chain(sqlite_url)
    done = cli("event", "no-such-id", env={"OUTBOX_DATABASE_URL": sqlite_url})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "outbox-tui: error: no outbox event with id 'no-such-id'"
    ]
    assert "Traceback" not in done.stderr
