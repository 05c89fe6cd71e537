"""Deterministic crash points for crash tests.

Code that has an irreversible step calls ``crash_point("name")`` just before or after it. When the
environment variable ``TABLETOPIC_CRASH_AT`` names that point (comma-separated names allowed), the process
dies on the spot with ``os._exit(137)``: no cleanup, no flush, as after a kill -9. Unset (production), a call
costs one dict lookup.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

_ARMED = frozenset(p.strip() for p in os.environ.get("TABLETOPIC_CRASH_AT", "").split(",") if p.strip())


def crash_point(name: str) -> None:
    """Die like kill -9 if ``TABLETOPIC_CRASH_AT`` names this point."""
    if name in _ARMED:
        log.critical("crash point %s reached: exiting with 137 as armed by TABLETOPIC_CRASH_AT", name)
        logging.shutdown()
        os._exit(137)
