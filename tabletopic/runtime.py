"""Event-loop selection: uvloop when available, the default asyncio loop otherwise."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop if it is installed (falling back to asyncio's loop)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        log.info("uvloop not available; using the default asyncio event loop")
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
