"""Request handlers, one module per API family; importing a module registers its handlers."""

from __future__ import annotations

import importlib

_MODULES = ("core", "produce", "fetch", "admin", "groups", "consumer_groups", "configs", "sasl", "scram", "acls",
            "quotas")


def load_all() -> None:
    """Import every handler module (idempotent) so that ``HANDLERS`` is complete."""
    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")
