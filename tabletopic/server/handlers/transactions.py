"""Transactions are not supported yet: the one place that refuses them, and how.

A transactional producer's FindCoordinator (key type 1) and InitProducerId with a transactional id are refused at
once with :data:`FIND_COORDINATOR_ERROR` / :data:`INIT_PRODUCER_ID_ERROR` and :data:`MESSAGE`, codes every client
treats as fatal, so ``init_transactions()`` fails in about a second with a reason instead of retrying until its own
time-out (why these codes: docs/design-notes.md, "Transactional producers refused with authorization codes").
:func:`refuse` logs a WARNING once per transactional id (:class:`RefusalLog`). Producers without a transactional id
(idempotent or not) are unaffected.

Rule: the transactional APIs (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
DescribeTransactions, ListTransactions) stay out of ApiVersions until they are built, so no client sends them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from tabletopic.errors import ErrorCode
from tabletopic.server.handlers.base import RequestContext

log = logging.getLogger(__name__)

FIND_COORDINATOR_ERROR = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
INIT_PRODUCER_ID_ERROR = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

MESSAGE = ("transactions are not supported by tabletopic yet: remove transactional.id (an idempotent producer "
           "without it works)")


class RefusalLog:
    """Logs each refused transactional id once at WARNING (the last ``max_ids`` are remembered), at most
    ``max_per_minute`` such lines a minute overall; everything else at DEBUG. Event-loop use only."""

    def __init__(self, max_ids: int = 1024, max_per_minute: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_ids = max_ids
        self.max_per_minute = max_per_minute
        self._clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._window_start = float("-inf")
        self._in_window = 0

    def refused(self, api: str, transactional_id: str, client_id: str | None, peer: str) -> bool:
        """Record one refusal; returns whether it was logged at WARNING."""
        new = transactional_id not in self._seen
        self._seen[transactional_id] = None
        self._seen.move_to_end(transactional_id)
        if len(self._seen) > self.max_ids:
            self._seen.popitem(last=False)
        now = self._clock()
        if now - self._window_start >= 60.0:
            self._window_start, self._in_window = now, 0
        warn = new and self._in_window < self.max_per_minute
        if warn:
            self._in_window += 1
        log.log(logging.WARNING if warn else logging.DEBUG,
                "refused %s for transactional id %r (client %s at %s): transactions are not supported by "
                "tabletopic yet", api, transactional_id, client_id, peer)
        return warn


_refusals = RefusalLog()


def refuse(ctx: RequestContext, api: str, transactional_id: str) -> str:
    """Log the refusal (rate-limited) and return the error message for the response."""
    _refusals.refused(api, transactional_id, ctx.client_id, ctx.client_host)
    return MESSAGE
