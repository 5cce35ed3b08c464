"""Reading a CloudEvent out of an AMQP message: structured or binary content mode.

Pure functions over ``ReceivedMessage`` (a copy of what the inbox reads of a delivery),
so every malformed case is tested without a broker. The outcome is an ``InboundEvent``
or an ``Undecodable`` with its reason, never an exception: the consumer must not crash
on a message.

- **Structured mode** (what engine.relay sends): content type
  ``application/cloudevents+json``; the body is one JSON object holding the attributes
  and ``data`` (or ``data_base64``). A body that is a JSON object with ``specversion``
  is read so too when the content type is missing.
- **Binary mode**: the attributes travel as message headers named ``ce-<attribute>``
  (``ce_``, ``cloudEvents_`` and ``cloudEvents:`` are read as well, as other bindings
  spell them); the body is ``data`` and the content type is ``datacontenttype``.

Only CloudEvents 1.0 is read. ``id``, ``source`` and ``type`` must be non-empty strings
that fit their columns. The outbox carries JSON objects, so ``data`` must be one (or
absent); strict JSON: NaN and Infinity are refused. Attributes holding text no database
stores (a NUL character, a lone surrogate) are refused here, as they would fail the whole
batch's INSERT; ``data`` is checked once, as it is encoded (engine.inbox.rows).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from engine.storage.payloads import PAYLOAD_TOO_DEEP, decode_json
from engine.storage.schema import INBOUND_ID_LENGTH, INBOUND_SOURCE_LENGTH

SPEC_VERSION = "1.0"
STRUCTURED_TYPE = "application/cloudevents"
BATCH_TYPE = "application/cloudevents-batch"
# Header prefixes of binary mode, lower-cased: ce- (as in HTTP, and what the issue
# names), ce_ (Kafka's binding), cloudEvents_ and cloudEvents: (AMQP 1.0's binding).
HEADER_PREFIXES = ("ce-", "ce_", "cloudevents_", "cloudevents:")
REQUIRED = ("id", "source", "type")
EVENT_TYPE_LENGTH = 200  # outbox_events.event_type
# Attributes the row holds in columns of their own (engine.inbox.rows); the rest are
# kept in ``inbound_attributes``.
IDENTITY = ("id", "source", "type")
Mode = Literal["structured", "binary"]
# A NUL character as JSON text spells it: \u0000 after an even number of backslashes.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One AMQP message as the inbox reads it: its body and the properties that matter."""

    body: bytes
    content_type: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    content_encoding: str | None = None
    type: str | None = None
    app_id: str | None = None
    timestamp: datetime | None = None
    routing_key: str | None = None
    exchange: str | None = None
    redelivered: bool = False

    def properties(self) -> dict[str, Any]:
        """The AMQP properties, JSON-ready (kept with a message that cannot be decoded)."""
        found: dict[str, Any] = {
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "message_id": self.message_id,
            "type": self.type,
            "app_id": self.app_id,
            "timestamp": self.timestamp,
            "routing_key": self.routing_key,
            "exchange": self.exchange,
            "redelivered": self.redelivered,
            "headers": dict(self.headers),
        }
        return {k: _json_ready(v) for k, v in found.items() if v not in (None, {})}


@dataclass(frozen=True, slots=True)
class InboundEvent:
    """A decoded CloudEvent: its identity, ``data`` (a JSON object, or None when it has
    none) and every other attribute (``specversion``, ``subject``, ``time``, extensions)."""

    id: str
    source: str
    type: str
    data: dict[str, Any] | None
    attributes: dict[str, Any]
    mode: Mode


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A message that is not a usable CloudEvent, and why (one line).

    ``id`` and ``source`` are set when they were read and fit their columns: the dead
    letter then carries the identity, so a second delivery of it is dropped too.
    """

    reason: str
    id: str | None = None
    source: str | None = None
    type: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


Decoded = InboundEvent | Undecodable


def decode_message(message: ReceivedMessage, *, max_bytes: int) -> Decoded:
    """The CloudEvent ``message`` carries, or why it carries none (see the module)."""
    size = len(message.body)
    if size > max_bytes:
        return Undecodable(
            f"too large: {size:,} bytes, over the limit of {max_bytes:,} (max_message_bytes)"
        )
    media = _media_type(message.content_type)
    headers = _attribute_headers(message.headers)
    if media.startswith(BATCH_TYPE):
        return Undecodable(f"batched CloudEvents ({media}) are not supported")
    if media.startswith(STRUCTURED_TYPE):
        if media != STRUCTURED_TYPE + "+json":
            return Undecodable(f"unsupported CloudEvents format {media!r} (only +json)")
        return _structured(message.body)
    if isinstance(headers, str):
        return Undecodable(headers)
    if headers:
        return _binary(message, headers, media)
    return _unlabelled(message.body, media)


def _structured(body: bytes) -> Decoded:
    parsed = _json_object(body, "the body")
    if isinstance(parsed, str):
        return Undecodable(parsed)
    attributes = {k: v for k, v in parsed.items() if k not in ("data", "data_base64")}
    if "data_base64" in parsed:
        if "data" in parsed:
            return _refused("both data and data_base64", attributes)
        data = _base64_data(parsed["data_base64"])
    elif "data" in parsed:
        value = parsed["data"]
        data = value if isinstance(value, dict) else _not_an_object(value)
    else:
        data = None
    return _event(attributes, data, "structured")


def _binary(message: ReceivedMessage, attributes: dict[str, Any], media: str) -> Decoded:
    if message.content_type is not None:
        attributes.setdefault("datacontenttype", message.content_type)
    if not message.body:
        return _event(attributes, None, "binary")
    if media and not _is_json_media(media):
        return _refused(
            f"data of content type {media!r} is not a JSON object (the outbox carries JSON)",
            attributes,
        )
    parsed = _json_object(message.body, "data")
    return _event(attributes, parsed, "binary")


def _unlabelled(body: bytes, media: str) -> Decoded:
    """Neither content type nor headers say CloudEvent: a JSON object with specversion is
    read as structured mode (producers that leave the content type out), else refused."""
    if not media or _is_json_media(media):
        parsed = _json_object(body, "the body")
        if isinstance(parsed, dict) and "specversion" in parsed:
            return _structured(body)
    shown = f"content type {media!r}" if media else "no content type"
    return Undecodable(f"not a CloudEvent: {shown}, no ce-* headers and no specversion in the body")


def _event(attributes: dict[str, Any], data: dict[str, Any] | str | None, mode: Mode) -> Decoded:
    """The event, once its attributes pass; ``data`` a string is why it is unusable."""
    version = attributes.get("specversion")
    if version is None:
        return _refused("missing required attribute specversion", attributes)
    if version != SPEC_VERSION:
        return _refused(f"unsupported specversion {version!r} (only {SPEC_VERSION})", attributes)
    for name in REQUIRED:
        value = attributes.get(name)
        if value is None:
            return _refused(f"missing required attribute {name}", attributes)
        if not isinstance(value, str) or not value:
            return _refused(f"attribute {name} must be a non-empty string", attributes)
    for name, limit in (
        ("source", INBOUND_SOURCE_LENGTH),
        ("id", INBOUND_ID_LENGTH),
        ("type", EVENT_TYPE_LENGTH),
    ):
        if len(attributes[name]) > limit:
            return _refused(f"attribute {name} is longer than {limit} characters", attributes)
    problem = unstorable(attributes)
    if problem is not None:
        return _refused(f"an attribute {problem}", attributes)
    if isinstance(data, str):
        return _refused(data, attributes)
    rest = {k: v for k, v in attributes.items() if k not in IDENTITY}
    return InboundEvent(
        attributes["id"], attributes["source"], attributes["type"], data, rest, mode
    )


def _refused(reason: str, attributes: dict[str, Any]) -> Undecodable:
    """Undecodable, keeping the identity when it was read and fits its columns."""
    source, event_id, event_type = (attributes.get(n) for n in ("source", "id", "type"))
    identified = (
        isinstance(source, str)
        and isinstance(event_id, str)
        and 0 < len(source) <= INBOUND_SOURCE_LENGTH
        and 0 < len(event_id) <= INBOUND_ID_LENGTH
        and unstorable({"source": source, "id": event_id}) is None
    )
    typed = (
        isinstance(event_type, str)
        and 0 < len(event_type) <= EVENT_TYPE_LENGTH
        and unstorable({"type": event_type}) is None
    )
    kept = {k: v for k, v in attributes.items() if unstorable({k: v}) is None}
    return Undecodable(
        reason,
        event_id if identified else None,
        source if identified else None,
        event_type if typed else None,
        kept,
    )


def _json_object(raw: bytes, what: str) -> dict[str, Any] | str:
    """The JSON object ``raw`` holds, or why it is none (one line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not JSON: {what} is not UTF-8 ({exc.reason} at byte {exc.start})"
    try:
        value = decode_json(text)
    except RecursionError:
        return f"not JSON: {what} is {PAYLOAD_TOO_DEEP}"
    except ValueError as exc:
        return f"not JSON: {what}: {exc}"
    if not isinstance(value, dict):
        return f"{what} is JSON {_json_kind(value)}, not a JSON object"
    return value


def _base64_data(value: Any) -> dict[str, Any] | str:
    if not isinstance(value, str):
        return "data_base64 is not a string"
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        return f"data_base64 is not base64: {exc}"
    return _json_object(raw, "data_base64")


def _not_an_object(value: Any) -> str:
    return f"data is JSON {_json_kind(value)}, not a JSON object (the outbox carries objects)"


def _json_kind(value: Any) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def unstorable(value: Any) -> str | None:
    """Why a decoded JSON value cannot be stored, else None (``unstorable_text``)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return unstorable_text(text)


def unstorable_text(text: str) -> str | None:
    """Why JSON text cannot be stored: a NUL character, which PostgreSQL's text and jsonb
    refuse, or a lone surrogate, which UTF-8 cannot encode; else None."""
    if _NUL.search(text):
        return "holds a NUL character (\\u0000), which the database cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (\\ud800-\\udfff), which UTF-8 cannot encode"
    return None


def _media_type(content_type: str | None) -> str:
    """``application/cloudevents+json`` of ``Application/CloudEvents+JSON; charset=utf-8``."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _is_json_media(media: str) -> bool:
    return media in ("application/json", "text/json") or media.endswith("+json")


def _attribute_headers(headers: Mapping[str, Any]) -> dict[str, Any] | str:
    """The CloudEvents attributes of binary mode's headers (names lower-cased, values as
    text or numbers), or why one cannot be read."""
    found: dict[str, Any] = {}
    for key, value in headers.items():
        name = str(key).lower()
        prefix = next((p for p in HEADER_PREFIXES if name.startswith(p)), None)
        if prefix is None or len(name) == len(prefix):
            continue
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return f"header {key} is not UTF-8 text"
        if isinstance(value, datetime):
            value = value.isoformat()
        elif not isinstance(value, str | int | float | bool):
            return f"header {key} is a {type(value).__name__}, not a CloudEvents attribute value"
        found[name[len(prefix) :]] = value
    return found


def _json_ready(value: Any) -> Any:
    """A property or header value as JSON can hold it and a database can store it: bytes
    as text when they are UTF-8 (else base64), NUL and lone surrogates escaped."""
    if isinstance(value, bytes | bytearray):
        try:
            return storable_text(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(bytes(value)).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {storable_text(str(k)): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and the infinities are no JSON
    if value is None or isinstance(value, int | float | bool):
        return value
    return storable_text(str(value))


def storable_text(text: str) -> str:
    """``text`` with NUL written as ``\\x00`` and lone surrogates as ``\\udXXX``."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
