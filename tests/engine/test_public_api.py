"""``engine`` is the public API: every error class is exported, and every export imports."""

from __future__ import annotations

import importlib
import inspect

import engine
from engine import errors


def test_every_outbox_error_is_exported() -> None:
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.OutboxError)
    }
    assert "PauseError" in classes
    assert classes - set(engine.__all__) == set()
    for name in classes:
        assert getattr(engine, name) is getattr(errors, name)


def test_every_name_in_all_imports() -> None:
    assert len(engine.__all__) == len(set(engine.__all__))
    namespace: dict[str, object] = {}
    exec("from engine import *", namespace)  # the star import a user would write
    for name in engine.__all__:
        assert name in namespace, name
        assert namespace[name] is getattr(importlib.import_module("engine"), name)


def test_the_operator_types_are_exported() -> None:
    from engine.operating.error_groups import ErrorGroup, ErrorGroups
    from engine.operating.insights import TypeCounts, UnservedType
    from engine.operating.pauses import Pause, PausedBacklog

    for value in (ErrorGroup, ErrorGroups, TypeCounts, UnservedType, Pause, PausedBacklog):
        assert getattr(engine, value.__name__) is value
        assert value.__name__ in engine.__all__
