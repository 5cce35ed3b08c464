"""Kept for imports from before the operations layer: apps load in ``engine.service``."""

from engine.errors import InstalledAppError
from engine.service.apps import delivery_problem, load_registry

__all__ = ["InstalledAppError", "delivery_problem", "load_registry"]
