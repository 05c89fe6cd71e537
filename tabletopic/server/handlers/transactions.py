"""Transactions are not supported yet: the one place that refuses them, and how.

A transactional producer first asks FindCoordinator (key type 1, its transactional id) for its transaction
coordinator, then InitProducerId with the transactional id. Both are refused at once with an error every client
treats as fatal, so ``init_transactions()`` / ``initTransactions()`` fails in about a second with a message,
instead of retrying until its own time-out with a generic one; the broker logs a WARNING once per transactional
id. The transactional APIs (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
DescribeTransactions, ListTransactions) are not advertised in ApiVersions, so no client sends them.
Producers without a transactional id (idempotent or not) are unaffected.

Why these codes (measured with confluent-kafka 2.16, the Java client 3.9.1, kafka-python 3.0 and aiokafka 0.14):

- Every client retries a retriable code (COORDINATOR_NOT_AVAILABLE, ...) until it times out (15-60 s, then a
  generic time-out error).
- On FindCoordinator, librdkafka gives up at once only on TRANSACTIONAL_ID_AUTHORIZATION_FAILED and
  CLUSTER_AUTHORIZATION_FAILED (it retries UNSUPPORTED_VERSION, INVALID_REQUEST, UNKNOWN_SERVER_ERROR, ...). The
  Java client fails at once on any non-retriable code and shows the broker's error message, except for
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which it reports as "Transactional Id authorization failed." without
  it. kafka-python and aiokafka fail at once on both and show only the code's name. So FindCoordinator answers
  CLUSTER_AUTHORIZATION_FAILED: fatal everywhere, and librdkafka and Java show our message.
- InitProducerId has no error-message field; librdkafka gives up at once only on the two authorization codes
  (and on fencing/time-out codes that would mislead more). It answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
  which at least names the transactional id as what was refused. Clients reach it only if they skip
  FindCoordinator.
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
