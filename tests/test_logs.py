"""tabletopic.logs: repeated conditions are logged on start and change, then at most once per period."""

from __future__ import annotations

import logging

import pytest

from tabletopic.logs import ConditionLog, RepeatFilter, quiet_third_party


def test_condition_log_rate_limits_per_key_and_state(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    cl = ConditionLog(logging.getLogger("tt.test.cond"), every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="tt.test.cond")

    def lines() -> list[str]:
        out = [r.getMessage() for r in caplog.records]
        caplog.clear()
        return out

    assert cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 6, state=6)
    for _ in range(5):  # every round: the same condition
        now[0] += 1
        assert not cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 6, state=6)
    assert lines() == ["p0 blocked at 6"]
    assert cl.log("other", logging.WARNING, "another condition")  # keys are independent
    assert cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 9, state=9)  # changed: at once
    assert lines() == ["another condition", "p0 blocked at 9"]
    now[0] += 30
    assert not cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 9, state=9)
    now[0] += 31  # a period after the last line: one reminder with the count
    assert cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 9, state=9)
    assert lines() == ["p0 blocked at 9 (still so; 1 repeat(s) not logged in the last 61 s)"]
    # cleared: said once, and the next occurrence is logged at once
    assert cl.clear("blocked", logging.INFO, "p%d unblocked", 0)
    assert not cl.clear("blocked", logging.INFO, "p%d unblocked", 0)
    assert cl.log("blocked", logging.ERROR, "p%d blocked at %d", 0, 9, state=9)
    assert lines() == ["p0 unblocked", "p0 blocked at 9"]


def test_condition_log_attaches_the_traceback_only_when_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    cl = ConditionLog(logging.getLogger("tt.test.exc"), every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="tt.test.exc")
    err = OSError("catalog down")
    for _ in range(3):
        cl.log("failed", logging.ERROR, "round failed: %s", err, state=str(err), exc_info=err)
        now[0] += 11
    assert [r.exc_info is not None for r in caplog.records] == [True, False, False]


def test_third_party_loggers_quiet_unless_debug() -> None:
    pyiceberg = logging.getLogger("pyiceberg")
    before = pyiceberg.level
    try:
        pyiceberg.setLevel(logging.NOTSET)
        quiet_third_party(logging.DEBUG)
        assert pyiceberg.level == logging.NOTSET  # a broker at DEBUG shows everything
        quiet_third_party(logging.INFO)
        assert pyiceberg.level == logging.WARNING
        assert not logging.getLogger("pyiceberg.io").isEnabledFor(logging.INFO)
    finally:
        pyiceberg.setLevel(before)


def test_a_library_repeating_a_failure_per_retry_is_heard_once_per_interval() -> None:
    """aiokafka logs "Unable connect to node" at ERROR on every retry while a broker is down: once per interval."""
    now = [0.0]
    f = RepeatFilter(every_s=60, clock=lambda: now[0])

    def rec(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord("aiokafka", level, __file__, 1, msg, ("n1",), None)

    assert f.filter(rec("Unable connect to node with id %s"))
    assert not any(f.filter(rec("Unable connect to node with id %s")) for _ in range(100))
    assert f.filter(rec("another failure %s"))  # a different message is not held back
    assert f.filter(rec("Unable connect to node with id %s", logging.WARNING))  # nor the same at another level
    now[0] = 61.0
    assert f.filter(rec("Unable connect to node with id %s"))


def test_condition_log_forgets_quiet_conditions_beyond_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys can come from clients (topic names, bad-input reasons; the fuzzer sends millions): the log remembers at
    most MAX_CONDITIONS, forgetting those quiet for a period first, else the oldest half; a recent one still holds."""
    import tabletopic.logs as logs

    monkeypatch.setattr(logs, "MAX_CONDITIONS", 100)
    now = [0.0]
    cl = ConditionLog(logging.getLogger("tt.test.bound"), every_s=60.0, clock=lambda: now[0])
    for i in range(100):
        cl.log(("old", i), logging.INFO, "x")
    now[0] = 61.0
    cl.log("recent", logging.INFO, "x")  # the old ones are quiet for a period now: forgotten
    assert len(cl._active) == 1 and cl.active("recent")
    for i in range(10_000):  # a flood of distinct keys within one period
        cl.log(("new", i), logging.INFO, "x")
    assert len(cl._active) <= 100
    assert cl.active(("new", 9_999)) and not cl.log(("new", 9_999), logging.INFO, "x")  # still rate-limited
