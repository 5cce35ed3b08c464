"""``outbox-tui catalog``: the installed apps' event types as a table, JSON and AsyncAPI 3.0,
and what the inbox receives, from the queue and bindings ``consume`` takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.cli.conftest import APP, REPO, Cli

CATALOG_APP = "tests.cli.catalog_app"
IN_REPO = ("--app-dir", str(REPO))  # where tests.cli.catalog_app is found
ASYNCAPI_SCHEMA = Path(__file__).resolve().parents[1] / "asyncapi" / "asyncapi-3.0.0.schema.json"
CONTEXT = {"tenant_id": "acme", "actor_id": "u-1", "request_id": "r-1"}
# The inbox as consume takes it: one binding routes two of catalog_app's types (a topic
# pattern), one names a type exactly, one routes none of them.
INBOX = (
    "--queue",
    "shop.inbox",
    "--bind",
    "storefront.events:shop.order_*",  # "*" stands for a whole word: it matches none
    "--bind",
    "storefront.events:shop.*",
    "--bind",
    "outbox.events:shop.pinged",
    "--bind",
    "warehouse.events:stock.#",
)


@pytest.fixture(scope="module")
def asyncapi_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(ASYNCAPI_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def by_type(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["event_type"]: entry for entry in record["event_types"]}


def test_json_lists_types_versions_schemas_handlers_ordering_and_routing(cli: Cli) -> None:
    result = cli(
        "catalog", "--installed-app", CATALOG_APP, *IN_REPO, "--json", "--exchange", "shop.events"
    )
    assert result.returncode == 0, result
    record = result.json()
    assert record["installed_apps"] == [CATALOG_APP]
    assert record["relay"] == {
        "exchange": "shop.events",
        "exchange_type": "topic",
        "configured": False,
    }
    types = by_type(record)
    assert list(types) == ["shop.invoice_sent", "shop.order_placed", "shop.pinged"]

    placed = types["shop.order_placed"]
    assert [(v["version"], v["schema_kind"], v["model"]) for v in placed["versions"]] == [
        (1, "pydantic", "OrderPlaced"),
        (2, "fields", None),
    ]
    assert placed["handlers"] == [
        {"key": "shop.reserve", "transactional": False},
        {"key": "shop.book", "transactional": True},
    ]
    assert placed["ordering"] == {"key": "aggregate", "on_dead_letter": "block"}
    assert placed["routing_key"] == "shop.order_placed"
    assert types["shop.invoice_sent"]["ordering"] == {"key": "payload", "on_dead_letter": "skip"}
    assert types["shop.pinged"]["ordering"] is None and types["shop.pinged"]["handlers"] == []
    assert record["inbox"] == {
        "configured": False,
        "queue": None,
        "bindings": [],
        "event_types": [],
    }

    # The JSON Schemas say what the registry checks: a real validator agrees with it.
    v1, v2 = (v["json_schema"] for v in placed["versions"])
    good_v1 = {"order_id": "o-1", "lines": [{"sku": "a", "quantity": 2}], **CONTEXT}
    jsonschema.validate(good_v1, v1)
    for bad in (
        {**good_v1, "lines": [{"sku": "a", "quantity": 0}]},
        {k: v for k, v in good_v1.items() if k != "tenant_id"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, v1)
    jsonschema.validate({"order_id": "o-1", "total": 3, "vip": None, **CONTEXT}, v2)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"order_id": "o-1", "total": "3", **CONTEXT}, v2)
    pinged = types["shop.pinged"]["versions"][0]["json_schema"]
    assert pinged["required"] == ["tenant_id", "actor_id", "request_id"]


def test_json_names_the_inbox_queue_its_bindings_and_the_types_they_route(cli: Cli) -> None:
    result = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, *INBOX, "--json")
    assert result.returncode == 0, result
    inbox = result.json()["inbox"]
    assert inbox == {
        "configured": True,
        "queue": "shop.inbox",
        "bindings": [
            {
                "exchange": "storefront.events",
                "routing_key": "shop.order_*",
                "event_types": [],
            },
            {
                "exchange": "storefront.events",
                "routing_key": "shop.*",
                "event_types": ["shop.invoice_sent", "shop.order_placed", "shop.pinged"],
            },
            {
                "exchange": "outbox.events",
                "routing_key": "shop.pinged",
                "event_types": ["shop.pinged"],
            },
            {"exchange": "warehouse.events", "routing_key": "stock.#", "event_types": []},
        ],
        "event_types": ["shop.invoice_sent", "shop.order_placed", "shop.pinged"],
    }


def test_the_inbox_comes_from_the_variables_consume_reads_and_flags_win(cli: Cli) -> None:
    env = {
        "OUTBOX_CONSUMER__QUEUE": "shop.inbox",
        "OUTBOX_CONSUMER__BINDINGS": '["storefront.events:shop.invoice_sent", "x:shop.#"]',
    }
    from_env = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, "--json", env=env)
    assert from_env.returncode == 0, from_env
    inbox = from_env.json()["inbox"]
    assert inbox["queue"] == "shop.inbox"
    assert [(b["exchange"], b["routing_key"]) for b in inbox["bindings"]] == [
        ("storefront.events", "shop.invoice_sent"),
        ("x", "shop.#"),
    ]
    assert inbox["bindings"][0]["event_types"] == ["shop.invoice_sent"]
    flags = ("--queue", "other.inbox", "--bind", "y:shop.pinged")
    given = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, *flags, "--json", env=env)
    inbox = given.json()["inbox"]
    assert inbox["queue"] == "other.inbox"
    assert inbox["bindings"] == [
        {"exchange": "y", "routing_key": "shop.pinged", "event_types": ["shop.pinged"]}
    ]


def test_a_bad_inbox_setting_is_one_error_line_not_a_catalog_without_inbox(cli: Cli) -> None:
    """The catalog reads the consumer's settings: a bad one stops it, as it stops consume
    (another command that does not read them goes on)."""
    env = {"OUTBOX_CONSUMER__BINDINGS": "no-colon"}
    result = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, env=env)
    result.assert_one_error_line(
        "OUTBOX_CONSUMER__BINDINGS / --bind must be EXCHANGE:ROUTING_KEY", status=2
    )
    flag = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, "--bind", "no-colon")
    flag.assert_one_error_line("--bind must be EXCHANGE:ROUTING_KEY", status=2)
    assert cli("init-db", env=env).returncode == 0
    assert cli("stats", "--json", env=env).returncode == 0


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def _resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _followed(document: dict[str, Any], ref: str) -> Any:
    """What ``ref`` points to, through references to references (an operation's message
    is its channel's, which is a component's)."""
    node = _resolve(document, ref)
    while isinstance(node, dict) and set(node) == {"$ref"}:
        node = _resolve(document, node["$ref"])
    return node


@pytest.mark.parametrize("app", [CATALOG_APP, APP])
def test_asyncapi_is_a_valid_asyncapi_3_document(cli: Cli, app: str, asyncapi_validator) -> None:
    result = cli(
        "catalog",
        "--installed-app",
        app,
        *IN_REPO,
        "--asyncapi",
        "--amqp-url",
        "amqp://shop:s3cret@mq.internal:5672/",
        *INBOX,
    )
    assert result.returncode == 0, result
    assert "s3cret" not in result.output
    document = json.loads(result.stdout)
    errors = [e.message for e in asyncapi_validator.iter_errors(document)]
    assert errors == []
    for ref in _refs(document):  # every reference points inside the document
        assert ref.startswith("#/") and _resolve(document, ref) is not None, ref
    assert document["asyncapi"] == "3.0.0"
    assert document["servers"]["rabbitmq"] == {
        "host": "mq.internal:5672",
        "protocol": "amqp",
        "protocolVersion": "0.9.1",
    }
    if app == CATALOG_APP:
        channel = document["channels"]["shop.order_placed"]
        assert channel["address"] == "shop.order_placed"
        assert channel["bindings"]["amqp"]["exchange"]["name"] == "outbox.events"
        assert set(channel["messages"]) == {"shop.order_placed.v1", "shop.order_placed.v2"}
        assert "Line" in document["components"]["schemas"]  # pydantic's $defs, hoisted
        operation = document["operations"]["send.shop.order_placed"]
        assert operation["action"] == "send"
        _assert_receives(document)


def _assert_receives(document: dict[str, Any]) -> None:
    """One channel and one receive operation per binding; each carries the CloudEvents
    messages of the types its routing key matches, or any CloudEvent when none."""
    receives = {k: v for k, v in document["operations"].items() if v["action"] == "receive"}
    assert len(receives) == 4
    by_binding = {op["title"]: op for op in receives.values()}
    wide = by_binding["inbox storefront.events:shop.*"]
    channel = _resolve(document, wide["channel"]["$ref"])
    assert channel["address"] == "shop.*"
    assert channel["bindings"]["amqp"]["is"] == "routingKey"
    assert channel["bindings"]["amqp"]["exchange"]["name"] == "storefront.events"
    assert wide["x-outbox-queue"] == "shop.inbox"
    assert wide["bindings"]["amqp"]["ack"] is True
    names = [_followed(document, ref["$ref"])["name"] for ref in wide["messages"]]
    assert names == [
        "shop.invoice_sent.v1",
        "shop.order_placed.v1",
        "shop.order_placed.v2",
        "shop.pinged.v1",
    ]
    # The same message the relay sends: one component, sent and received.
    send = document["operations"]["send.shop.pinged"]
    exact = by_binding["inbox outbox.events:shop.pinged"]
    assert [_followed(document, r["$ref"]) for r in exact["messages"]] == [
        _followed(document, r["$ref"]) for r in send["messages"]
    ]
    for title in ("inbox storefront.events:shop.order_*", "inbox warehouse.events:stock.#"):
        (ref,) = by_binding[title]["messages"]
        message = _followed(document, ref["$ref"])
        assert message["name"] == "CloudEvent"
        assert message["payload"]["required"] == ["specversion", "id", "source", "type"]
    # Two bindings on one exchange whose keys read alike as identifiers get two channels.
    channels = [op["channel"]["$ref"] for op in receives.values()]
    assert len(set(channels)) == 4
    assert "'shop.inbox'" in document["info"]["description"]


def test_without_an_inbox_the_document_receives_nothing(cli: Cli, asyncapi_validator) -> None:
    result = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, "--asyncapi")
    document = json.loads(result.stdout)
    assert list(asyncapi_validator.iter_errors(document)) == []
    assert {op["action"] for op in document["operations"].values()} == {"send"}
    assert "CloudEvent" not in document["components"]["messages"]


def test_a_document_that_breaks_asyncapi_is_refused_by_the_validator(asyncapi_validator) -> None:
    """The validator is not a rubber stamp."""
    broken = {"asyncapi": "3.0.0", "info": {"title": "t"}, "channels": {"c": {"address": 3}}}
    assert list(asyncapi_validator.iter_errors(broken))


def test_the_table_names_each_type(cli: Cli) -> None:
    result = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO)
    assert result.returncode == 0, result
    assert "shop.order_placed" in result.stdout and "v1 OrderPlaced, v2 fields" in result.stdout
    assert "shop.book (tx)" in result.stdout
    assert "no inbox: --queue and --bind" in result.stdout
    with_inbox = cli("catalog", "--installed-app", CATALOG_APP, *IN_REPO, *INBOX)
    assert with_inbox.returncode == 0, with_inbox
    lines = [line.rstrip() for line in with_inbox.stdout.splitlines()]
    assert "inbox: queue shop.inbox" in lines
    assert "  storefront.events:shop.* → shop.invoice_sent, shop.order_placed, shop.pinged" in lines
    assert "  warehouse.events:stock.# → no registered type" in lines


def test_without_an_installed_app_or_with_both_outputs_it_is_one_line(cli: Cli) -> None:
    cli("catalog").assert_one_error_line("--installed-app", status=2)
    both = cli("catalog", "--installed-app", APP, "--json", "--asyncapi")
    both.assert_one_error_line("not allowed with argument", status=2)
    missing = cli("catalog", "--installed-app", "no_such_app_here")
    missing.assert_one_error_line("cannot import installed app", status=2)
