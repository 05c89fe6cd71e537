"""Logging policy shared by the broker's modules: third-party chatter off, repeated conditions rate-limited.

:func:`quiet_third_party` is part of the broker's logging set-up (``tabletopic serve``): libraries that log at
INFO on every call (pyiceberg's "Loaded FileIO" on every table load) are set to WARNING, unless the broker runs
at DEBUG.

:class:`ConditionLog` is for conditions that persist and would otherwise be logged on every round or retry (a
blocked partition, a failing commit round, an unreachable catalog): the first occurrence and every change are
logged at once; while the condition stays the same, at most one line per ``every_s`` seconds, saying how many
repeats were suppressed; :meth:`ConditionLog.clear` ends the condition (and can say so).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

# loggers of libraries that log routine work at INFO
THIRD_PARTY_LOGGERS = ("pyiceberg",)
# loggers of libraries that log the same failure on every retry (aiokafka: "Unable connect to node ..." at ERROR
# while a broker is down): each distinct message at most once per DEFAULT_EVERY_S. A logger's filters see only the
# records logged on it, not its children's: each module's logger is named (its fetcher logs "Failed fetch messages"
# and its producer's sender "Got error produce response" on every retry, every 100 ms)
REPEATING_LOGGERS = ("aiokafka", "aiokafka.conn", "aiokafka.consumer.fetcher", "aiokafka.producer.sender")

DEFAULT_EVERY_S = 60.0
# conditions a ConditionLog remembers at most: keys can come from clients (topic names, bad-input reasons), so past
# this the ones quiet for ``every_s`` are forgotten (their next occurrence is logged at once, as if new), then the
# oldest half
MAX_CONDITIONS = 4096


def quiet_third_party(level: int = logging.INFO) -> None:
    """Set the third-party loggers to WARNING and rate-limit those that repeat themselves per retry, unless the
    broker's own ``level`` is DEBUG (or finer)."""
    if level > logging.DEBUG:
        for name in THIRD_PARTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        for name in REPEATING_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, RepeatFilter) for f in logger.filters):
                logger.addFilter(RepeatFilter())


class RepeatFilter(logging.Filter):
    """Lets each distinct message (its format string and level) through at most once per ``every_s`` seconds."""

    def __init__(self, every_s: float = DEFAULT_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._every_s = every_s
        self._clock = clock
        self._last: dict[tuple[int, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, str(record.msg))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            return False
        if len(self._last) > 1000:  # bounded: messages are format strings, but some libraries inline values
            self._last.clear()
        self._last[key] = now
        return True


@dataclass(slots=True)
class _Condition:
    state: Hashable
    logged_at: float
    suppressed: int = 0


class ConditionLog:
    """Rate-limited logging of repeated conditions, each identified by a ``key`` (see the module doc).

    Not thread-safe: use one per event-loop object (a worker, a coordinator).
    """

    def __init__(self, logger: logging.Logger, every_s: float = DEFAULT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self.every_s = every_s
        self._clock = clock
        self._active: dict[Hashable, _Condition] = {}

    def log(self, key: Hashable, level: int, msg: str, *args: object, state: Hashable = None,
            exc_info: BaseException | bool | None = None) -> bool:
        """Log ``msg % args`` for condition ``key`` unless it was logged less than ``every_s`` ago in the same
        ``state``; returns whether a line was written. ``exc_info`` is only attached when the condition starts
        or changes (the reminders stay one line)."""
        now = self._clock()
        cond = self._active.get(key)
        if cond is None or cond.state != state:
            if cond is None and len(self._active) >= MAX_CONDITIONS:
                self._forget(now)
            self._active[key] = _Condition(state, now)
            self._logger.log(level, msg, *args, exc_info=exc_info)
            return True
        if now - cond.logged_at < self.every_s:
            cond.suppressed += 1
            return False
        if cond.suppressed:
            msg += " (still so; %d repeat(s) not logged in the last %.0f s)"
            args = (*args, cond.suppressed, now - cond.logged_at)
        cond.logged_at, cond.suppressed = now, 0
        self._logger.log(level, msg, *args)
        return True

    def _forget(self, now: float) -> None:
        """Bound the memory: drop conditions logged ``every_s`` ago or more, else the oldest half."""
        quiet = [k for k, c in self._active.items() if now - c.logged_at >= self.every_s]
        if not quiet:
            oldest = sorted(self._active.items(), key=lambda kc: kc[1].logged_at)
            quiet = [k for k, _ in oldest[: len(oldest) // 2]]
        for k in quiet:
            del self._active[k]

    def clear(self, key: Hashable, level: int = logging.INFO, msg: str | None = None, *args: object) -> bool:
        """End condition ``key``: its next occurrence is logged at once. Logs ``msg`` (if given) only when the
        condition was active; returns whether it was."""
        if self._active.pop(key, None) is None:
            return False
        if msg is not None:
            self._logger.log(level, msg, *args)
        return True

    def active(self, key: Hashable) -> bool:
        return key in self._active


__all__ = ["ConditionLog", "quiet_third_party"]
