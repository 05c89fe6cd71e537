"""Deterministic crash points for crash tests, and fail points for tests of how failures show.

Code that has an irreversible step calls ``crash_point("name")`` just before or after it. When the
environment variable ``TABLETOPIC_CRASH_AT`` names that point (comma-separated names allowed), the process
dies on the spot with ``os._exit(137)``: no cleanup, no flush, as after a kill -9. Unset (production), a call
costs one dict lookup.

``fail_point("name", scope)`` raises :class:`InjectedFaultError` when ``TABLETOPIC_FAIL_AT`` names ``name`` or
``name@scope`` (a topic, say): the code around it then handles a failure it cannot tell from a real one.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

_ARMED = frozenset(p.strip() for p in os.environ.get("TABLETOPIC_CRASH_AT", "").split(",") if p.strip())
_FAILING = frozenset(p.strip() for p in os.environ.get("TABLETOPIC_FAIL_AT", "").split(",") if p.strip())


class InjectedFaultError(RuntimeError):
    """Raised at a fail point armed by ``TABLETOPIC_FAIL_AT`` (tests only)."""


def crash_point(name: str) -> None:
    """Die like kill -9 if ``TABLETOPIC_CRASH_AT`` names this point."""
    if name in _ARMED:
        log.critical("crash point %s reached: exiting with 137 as armed by TABLETOPIC_CRASH_AT", name)
        logging.shutdown()
        os._exit(137)


def fail_point(name: str, scope: str = "", raising: type[Exception] = InjectedFaultError) -> None:
    """Raise ``raising`` (InjectedFaultError unless told) if ``TABLETOPIC_FAIL_AT`` names this point (``name``, or
    ``name@scope``)."""
    if _FAILING and (name in _FAILING or f"{name}@{scope}" in _FAILING):
        raise raising(f"fail point {name} armed by TABLETOPIC_FAIL_AT")
