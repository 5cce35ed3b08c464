"""The engine's exception tree: one root, specific subclasses, one clear line each.

Front ends (CLI, console) catch ``OutboxError`` and print ``str(exc)``; anything
else escaping is a bug.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Root of every error the engine raises on purpose."""


class ConfigurationError(OutboxError):
    """A setting or argument is invalid (named in the message)."""


class DatabaseUrlError(ConfigurationError):
    """The database URL cannot be parsed or names an unsupported driver."""


class InstalledAppError(ConfigurationError):
    """An installed app could not be imported or registered."""


class NothingToDeliverError(ConfigurationError):
    """A dispatcher would have nothing to deliver the events with (no handlers, no relay)."""


class BrokerUnavailableError(OutboxError):
    """RabbitMQ cannot be reached (the message names the masked URL)."""


class StorageError(OutboxError):
    """The database could not be reached or refused an operation."""


class DatabaseUnavailableError(StorageError):
    """The database server or file cannot be reached."""


class DatabaseAuthenticationError(DatabaseUnavailableError):
    """The database server refused the login: the user name or the password is wrong."""


class SchemaMissingError(StorageError):
    """The outbox tables do not exist in the target database."""


class SchemaOutdatedError(StorageError):
    """The outbox tables were made by an earlier version: ``init-db`` upgrades them."""


class OutboxTransactionError(OutboxError):
    """An outbox write was attempted outside an active unit of work."""


class EventRegistrationError(OutboxError):
    """An event type, handler or domain event mapping was registered wrongly."""


class EventValidationError(OutboxError):
    """An event does not satisfy its registered type, version or schema."""


class UnknownEventTypeError(EventValidationError):
    """The event type and version pair is not registered."""


class TenantMismatchError(EventValidationError):
    """The payload's tenant_id differs from the event's tenant."""


class DomainEventError(OutboxError):
    """A domain event could not be turned into an outbox row."""


class ReplayError(OutboxError):
    """A dead-letter replay was refused."""


class PauseError(OutboxError):
    """A pause or resume was refused (already paused, or not paused)."""


class EventNotFoundError(OutboxError):
    """No outbox event has the given id."""


class EventHandlerPermanentError(OutboxError):
    """Raised by a handler when retrying can never succeed.

    The dispatcher dead-letters the event at once and keeps the permanent
    classification in ``last_error`` and ``dead_letter_reason``.
    """
