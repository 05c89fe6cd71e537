"""worker.reasons: bad-data reasons in words, and error text that never carries record contents."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pyarrow as pa
import pytest

from worker.evolution import scatter
from worker.reasons import ERROR_TEXT_MAX, describe, error_text, is_outage

pytestmark = pytest.mark.timeout(60)

SECRET = "card-4111\x01\xff"


def _fails() -> pa.Array:
    return scatter(1, [([0], pa.array([SECRET]))], pa.float64())  # Arrow's message quotes the value


def test_error_text_drops_values_and_says_where() -> None:
    with pytest.raises(pa.ArrowInvalid) as local:
        _fails()
    # the broker's own kind of pool (worker.pool: forkserver), not a fork of this (large) test process
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool, \
            pytest.raises(pa.ArrowInvalid) as remote:
        pool.submit(_fails).result()
    for caught in (local.value, remote.value):
        text = error_text(caught)
        assert SECRET not in text and "card" not in text
        assert text.startswith("ArrowInvalid: Failed to parse string: '…' as a scalar of type double")
        assert "(at worker/evolution.py:" in text and text.endswith(")")
    assert error_text(ValueError("x" * 1000)).startswith("ValueError: " + "x" * 100)
    assert len(error_text(ValueError("x" * 1000)).split(" (at ")[0]) == ERROR_TEXT_MAX
    assert "b'" not in error_text(ValueError("bad b'\\x00\\x01' here"))


def test_outages_are_what_a_retry_may_cure() -> None:
    from concurrent.futures.process import BrokenProcessPool

    from pyiceberg.exceptions import ServiceUnavailableError
    from sqlalchemy.exc import OperationalError

    assert all(is_outage(e) for e in (OSError("disk"), MemoryError(), TimeoutError(), BrokenProcessPool(),
                                      OperationalError("SELECT", None, Exception("database is locked")),
                                      ServiceUnavailableError("catalog down")))
    assert not any(is_outage(e) for e in (ValueError(), pa.ArrowInvalid("x"), KeyError("k"), TypeError()))
    # an error that says whether a retry helps (a Kafka client's, an attach direct read's) is taken at its word
    from aiokafka.errors import NotLeaderForPartitionError, UnsupportedVersionError

    from tabletopic.attach.direct import DirectReadError

    assert is_outage(NotLeaderForPartitionError()) and is_outage(DirectReadError("t-0: leader moved", 6, True))
    assert not is_outage(UnsupportedVersionError()) and not is_outage(DirectReadError("t-0: bad CRC", None, False))


@pytest.mark.parametrize(("reason", "words"), [
    ("empty_value", "the value is empty"), ("wrong_magic_byte_key", "convert.key.type=by_latest_schema"),
    ("confluent_framed_value", "use convert.value.type=by_schema_id"), ("id_column_null", "id column"),
    ("trailing_bytes_value", "left over"), ("no_such_reason", "no_such_reason")])
def test_every_reason_has_words(reason: str, words: str) -> None:
    assert words in describe(reason)
