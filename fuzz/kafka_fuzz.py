"""A fuzzer for tabletopic's Kafka protocol server: the broker must survive any client input.

Frames come from three sources:

- hypothesis strategies built from the protocol's own message definitions (kafka-python's JSON-schema-driven
  request classes behind :func:`tabletopic.protocol.codec.request_class`): every API key and version of
  ``codec.SUPPORTED_VERSIONS``, well-typed random field values (empty, huge and unicode strings, empty and large
  arrays, integers at their bounds, nulls where nullable, tagged fields present or not), encoded to valid frames;
- mutations of those valid frames: bit flips, bytes inserted or deleted, length fields overwritten, truncation,
  a size prefix that lies, API key and version swapped;
- raw garbage and frames cut short by a closed connection.

The runner (:func:`run`) sends them to one broker over several connections, opening a new one whenever the broker
closes one (its expected answer to bad input), while a canary (a confluent-kafka producer and consumer on a topic
of its own, and a fresh Metadata request on a new connection) checks every second that everyone else is served.
It reports crashes (the process died; it is restarted), hangs (a canary step unanswered within ``hang_s``), the
broker's RSS (after warm-up, at the end, and its peak, VmHWM) and the handler exceptions the broker logged
("handler for API key ... failed"), by API key and exception.

    .venv/bin/python fuzz/kafka_fuzz.py --frames 1000000
    .venv/bin/python fuzz/kafka_fuzz.py --seconds 600
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tabletopic.protocol import codec
from tests.helpers.procs import BrokerProcess

# ---------------------------------------------------------------------------------------------------------------
# Schema-driven strategies
# ---------------------------------------------------------------------------------------------------------------

_INT_BOUNDS = {"int8": (-(1 << 7), (1 << 7) - 1), "int16": (-(1 << 15), (1 << 15) - 1), "uint16": (0, 65535),
               "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}
FUZZ_TOPICS = ("fuzz-t0", "fuzz-t1")
"""Topics the runner creates so that generated requests reach past "unknown topic" into the handlers' depths."""
NAME_POOL = (*FUZZ_TOPICS, "fuzz-g", "fuzz-txn", "fuzz-user", "User:fuzz", "PLAIN", "SCRAM-SHA-256", "cleanup.policy",
             "retention.ms", "*", "0")
"""Names drawn often for string fields; no table-topic setting among them (it would start Spark work)."""
HUGE_STRING_CHARS = 32_767  # the longest string a non-flexible version can carry (an int16 length)


def _valid_batch() -> bytes:
    """One small, valid record batch (magic 2) for ``records`` fields: Produce gets past its CRC checks."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(3):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"fuzz" * i, headers=[])
    return bytes(b.build())


def _int_strategy(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([v for v in (lo, hi, -1, 0, 1) if lo <= v <= hi]), st.integers(max(lo, -1), 64),
                     st.integers(lo, hi))


def _simple_strategy(type_str: str, huge: bool = True) -> st.SearchStrategy[Any]:
    """Values of one simple schema type: bounds and small values for integers, odd strings (``huge``: one of
    the longest a string can be) and bytes."""
    if type_str in _INT_BOUNDS:
        return _int_strategy(*_INT_BOUNDS[type_str])
    if type_str == "string":
        return st.one_of(st.sampled_from(NAME_POOL), st.just(""), st.text(max_size=24),
                         st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12),
                         st.just("\u00e9\U0001f600" * 8), st.just("x" * (HUGE_STRING_CHARS if huge else 300)))
    if type_str in ("bytes", "records"):
        batch = _valid_batch()
        return st.one_of(st.just(b""), st.binary(max_size=64), st.just(batch),
                         st.binary(min_size=61, max_size=61).map(lambda head: head + batch[61:]))
    if type_str == "bool":
        return st.booleans()
    if type_str == "uuid":
        return st.one_of(st.uuids(), st.just(uuid.UUID(int=0)))
    if type_str == "float64":
        return st.floats()
    raise ValueError(f"no strategy for schema type {type_str!r}")


def _array_strategy(elem: st.SearchStrategy[Any], large: st.SearchStrategy[Any] | None,
                    most: int) -> st.SearchStrategy[list[Any]]:
    """Arrays: usually short, sometimes empty, and (from ``large``, when given) one element repeated up to
    ``most`` times: large arrays that cost hypothesis one draw."""
    options = [st.lists(elem, max_size=3), st.just([])]
    if large is not None:
        options.append(st.tuples(large, st.integers(50, most)).map(lambda en: [en[0]] * en[1]))
    return st.one_of(options)


def _field_strategy(f: Any, version: int, depth: int) -> st.SearchStrategy[Any]:
    """A strategy for one schema field (kafka-python's field object) at ``version``; ``None`` where nullable.
    Large arrays only at the top (``depth`` 0), of elements without huge strings: frames stay below a few MB."""
    top = depth == 0
    if f.is_struct_array():
        elem = _struct_strategy(f, version, f.data_class, depth + 1)
        strat: st.SearchStrategy[Any] = _array_strategy(elem, elem if top else None, 100)
    elif f.is_array():
        small = _simple_strategy(f.array_of.type_str, huge=False)
        strat = _array_strategy(_simple_strategy(f.array_of.type_str), small if top else None, 5000)
    elif f.is_struct():
        strat = _struct_strategy(f, version, f.data_class, depth + 1)
    else:
        strat = _simple_strategy(f.type_str)
    if f.nullable_for_version_q(version):
        strat = st.one_of(st.none(), strat)
    return strat


def _struct_strategy(struct: Any, version: int, build: Callable[..., Any], depth: int) -> st.SearchStrategy[Any]:
    """``build(**fields)`` over the fields ``struct`` has at ``version``; tagged fields are optional."""
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in struct.fields.values():
        if f.for_version_q(version):
            (optional if f.tagged_field_q(version) else required)[f.name] = _field_strategy(f, version, depth)
    return st.fixed_dictionaries(required, optional=optional).map(lambda kw: build(**kw))


_REQUEST_STRATEGIES: dict[tuple[int, int], st.SearchStrategy[Any]] = {}


def request_strategy(api_key: int, version: int) -> st.SearchStrategy[Any]:
    """Well-typed requests (message objects, header not set) of ``api_key`` at ``version``, from its schema."""
    key = (api_key, version)
    if key not in _REQUEST_STRATEGIES:
        cls = codec.request_class(api_key)[version]
        _REQUEST_STRATEGIES[key] = _struct_strategy(cls._struct, version, cls, 0)
    return _REQUEST_STRATEGIES[key]


def api_versions() -> list[tuple[int, int]]:
    """Every (API key, version) the broker advertises."""
    return [(k, v) for k, (lo, hi) in sorted(codec.SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]


def encode_frame(msg: Any, correlation_id: int, client_id: str | None) -> bytes:
    """The request framed as a client sends it: size prefix, request header, body."""
    msg.with_header(correlation_id=correlation_id, client_id=client_id)
    data: bytes = msg.encode(header=True, framed=True)
    return data


@st.composite
def frames(draw: st.DrawFn, pairs: list[tuple[int, int]]) -> tuple[int, int, bytes | None]:
    """(API key, version, frame) of a well-typed request of one of ``pairs``; the frame is None when
    kafka-python cannot encode the drawn values (e.g. a huge string in a field that cannot hold it)."""
    api_key, version = draw(st.sampled_from(pairs))
    msg = draw(request_strategy(api_key, version))
    corr = draw(_int_strategy(*_INT_BOUNDS["int32"]))
    client_id = draw(st.one_of(st.none(), st.just("fuzz"), st.text(max_size=16)))
    try:
        return api_key, version, encode_frame(msg, corr, client_id)
    except Exception:  # out-of-range values for a type (an int8 in an int16 slot...) are the generator's matter
        return api_key, version, None


def generate_valid(count: int, run_seed: int) -> list[tuple[int, int, bytes]]:
    """About ``count`` draws of :func:`frames` (hypothesis' generation phase only), spread evenly over every
    advertised API and version: one hypothesis run per version (its own choice among many favours a few and
    leaves some out); the encodable ones are returned."""
    out: list[tuple[int, int, bytes]] = []
    pairs = api_versions()
    for i, pair in enumerate(pairs):

        @seed(run_seed * 1009 + i)
        @settings(max_examples=max(1, count // len(pairs)), database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(frames([pair]))
        def collect(drawn: tuple[int, int, bytes | None]) -> None:
            if drawn[2] is not None:
                out.append((drawn[0], drawn[1], drawn[2]))

        collect()
    return out


# ---------------------------------------------------------------------------------------------------------------
# Mutations and garbage
# ---------------------------------------------------------------------------------------------------------------

_BOUNDARY_INTS = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


@dataclass(frozen=True, slots=True)
class Frame:
    """Bytes to send on one connection; ``close_after`` cuts the connection right after (a truncated frame)."""

    data: bytes
    kind: str
    close_after: bool = False


def _framed(body: bytes | bytearray) -> bytes:
    return struct.pack(">i", len(body)) + bytes(body)


def _flip_bits(rng: random.Random, body: bytearray) -> str:
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(body))
        body[i] ^= 1 << rng.randrange(8)
    return "bitflip"


def _insert_bytes(rng: random.Random, body: bytearray) -> str:
    i = rng.randrange(len(body) + 1)
    body[i:i] = rng.randbytes(rng.randint(1, 16))
    return "insert"


def _delete_bytes(rng: random.Random, body: bytearray) -> str:
    i = rng.randrange(len(body))
    del body[i:i + rng.randint(1, 16)]
    return "delete"


def _overwrite_length(rng: random.Random, body: bytearray) -> str:
    """An int16/int32/varint-looking slot after the header's fixed part set to a boundary value."""
    i = rng.randrange(8, len(body)) if len(body) > 8 else rng.randrange(len(body))
    width = rng.choice((1, 2, 4))
    value = rng.choice(_BOUNDARY_INTS) & ((1 << (8 * width)) - 1)
    body[i:i + width] = value.to_bytes(width, "big")
    return "length"


def _truncate(rng: random.Random, body: bytearray) -> str:
    del body[rng.randrange(len(body)):]
    return "truncate"


def _swap_api(rng: random.Random, body: bytearray, pairs: list[tuple[int, int]]) -> str:
    """Another API's key and version (advertised, or any int16) on this body."""
    if rng.random() < 0.7:
        key, version = rng.choice(pairs)
    else:
        key, version = rng.randint(-(1 << 15), (1 << 15) - 1), rng.randint(-(1 << 15), (1 << 15) - 1)
    body[0:4] = struct.pack(">hh", key, version)
    return "swap-api"


def mutate(rng: random.Random, valid: bytes, pairs: list[tuple[int, int]]) -> Frame:
    """One mutation of a valid framed request; the size prefix tells the truth unless the mutation is a lie."""
    body = bytearray(valid[4:])
    pick = rng.randrange(8)
    if pick == 0:
        return _lying_size(rng, bytes(body))
    if pick == 1:
        kind = _swap_api(rng, body, pairs)
    else:
        mutators = (_flip_bits, _insert_bytes, _delete_bytes, _overwrite_length, _truncate, _flip_bits)
        kind = mutators[pick - 2](rng, body) if body else "empty"
    if rng.random() < 0.2:  # mutations compound
        kind += "+" + _flip_bits(rng, body) if body else ""
    return Frame(_framed(body), kind)


def _lying_size(rng: random.Random, body: bytes) -> Frame:
    """The size prefix lies: longer (the broker waits for bytes that become the next frames), shorter, negative,
    zero or beyond any limit."""
    size = rng.choice((len(body) + rng.randint(1, 64), max(0, len(body) - rng.randint(1, 64)), -1, 0,
                       -(1 << 31), (1 << 31) - 1, 100 * 1024 * 1024 + 1))
    return Frame(struct.pack(">i", size) + body, "size-lie")


def garbage(rng: random.Random, pairs: list[tuple[int, int]]) -> Frame:
    """Raw garbage: random bytes framed or not, a bare header, or a valid-looking start cut by a closed socket."""
    pick = rng.randrange(4)
    if pick == 0:
        return Frame(_framed(rng.randbytes(rng.randint(0, 256))), "garbage-framed")
    if pick == 1:
        return Frame(rng.randbytes(rng.randint(1, 64)), "garbage-raw")
    key, version = rng.choice(pairs)
    header = struct.pack(">hhi", key, version, rng.randint(0, 1000))
    if pick == 2:
        return Frame(_framed(header[: rng.randint(0, len(header))]), "short-header")
    return Frame(struct.pack(">i", 64) + header, "cut-by-close", close_after=True)


# ---------------------------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Options:
    """What one run does. ``frames`` or ``seconds`` bounds it (whichever comes first); ``valid_share`` of the frames
    are schema-generated, ``garbage_share`` raw garbage, the rest mutations."""

    frames: int = 20_000
    seconds: float = 0.0
    connections: int = 4
    seed: int = 0
    hang_s: float = 10.0
    valid_share: float = 0.3
    garbage_share: float = 0.1
    data_dir: Path | None = None
    quiet: bool = False


@dataclass
class Report:
    """What a run found; :meth:`summary` prints it."""

    frames: int = 0
    by_api: Counter[tuple[int, int]] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    unencodable: int = 0
    reconnects: int = 0
    stalled: int = 0
    topics_deleted: int = 0
    crashes: int = 0
    hangs: list[str] = field(default_factory=list)
    canary_rounds: int = 0
    rss_start_kb: int = 0
    rss_end_kb: int = 0
    peak_rss_kb: int = 0
    handler_errors: Counter[tuple[int, str]] = field(default_factory=Counter)
    other_errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> str:
        """The figures, one per line, then the handler exceptions by API key."""
        names = {int(k): k.name for k in codec.ApiKey}
        apis = {k for k, _ in self.by_api}
        lines = [
            f"frames sent        {self.frames} in {self.seconds:.0f} s ({self.frames / max(self.seconds, 1e-9):.0f}/s)",
            f"schema-generated   {sum(self.by_api.values())} over {len(apis)} APIs, {len(self.by_api)} versions "
            f"(unencodable draws skipped: {self.unencodable})",
            f"by kind            {dict(self.by_kind.most_common())}",
            f"reconnects         {self.reconnects} (broker closed the connection), stalled sends {self.stalled}",
            f"janitor            {self.topics_deleted} topics the fuzz frames created deleted",
            f"crashes            {self.crashes}",
            f"hangs              {len(self.hangs)} {self.hangs[:5]}",
            f"canary rounds      {self.canary_rounds}",
            f"broker RSS         {self.rss_start_kb // 1024} MB after warm-up, {self.rss_end_kb // 1024} MB at the "
            f"end, peak {self.peak_rss_kb // 1024} MB",
            f"handler exceptions {sum(self.handler_errors.values())}",
        ]
        lines += [f"  {names.get(k, k)} ({k}): {n} x {exc}" for (k, exc), n in self.handler_errors.most_common()]
        lines.append(f"other errors logged {sum(self.other_errors.values())}")
        lines += [f"  {n} x {text}" for text, n in self.other_errors.most_common(10)]
        return "\n".join(lines)


class FuzzConnection:
    """One connection the fuzz frames go out on; a reader thread drains the answers (the broker answers in order
    and stops reading when answers pile up). A send that fails or stalls opens a new connection."""

    def __init__(self, bootstrap: str, report: Report) -> None:
        self._addr = bootstrap.rsplit(":", 1)
        self._report = report
        self._sock: socket.socket | None = None

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self._addr[0], int(self._addr[1])), timeout=5.0)
        threading.Thread(target=_drain, args=(sock,), daemon=True).start()
        return sock

    def send(self, frame: Frame) -> None:
        """Send one frame; a closed, reset or stalled connection is replaced by a new one (the frame is lost)."""
        for _ in range(3):
            try:
                if self._sock is None:
                    self._sock = self._open()
                self._sock.sendall(frame.data)
                if frame.close_after:
                    self.close()
                return
            except TimeoutError:
                self._report.stalled += 1
            except OSError:
                self._report.reconnects += 1
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            # shutdown first: a bare close() leaves the socket open while the drain thread's recv holds it, so the
            # broker kept every replaced connection (and its partial frame) until connections.max.idle.ms
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None


def _drain(sock: socket.socket) -> None:
    """Read and drop everything the broker sends until it closes the connection (or we do)."""
    try:
        sock.settimeout(None)
        while sock.recv(65536):
            pass
    except OSError:
        pass


def _rss_kb(pid: int, key: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Canary:
    """Another client that must be served throughout: each round produces one record with confluent-kafka
    (acks=all) and consumes it back, and asks a fresh connection for Metadata; a step not answered within
    ``hang_s`` is a hang. It also watches the process (a crash is counted and the broker restarted) and its RSS."""

    def __init__(self, broker: BrokerProcess, topic: str, report: Report, hang_s: float) -> None:
        from confluent_kafka import Consumer, Producer

        self._broker, self._topic, self._report, self._hang_s = broker, topic, report, hang_s
        common = {"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": int(hang_s * 1000)}
        self._producer = Producer({**common, "acks": "all", "linger.ms": 0,
                                   "message.timeout.ms": int(hang_s * 1000)})
        self._consumer = Consumer({**common, "group.id": topic,
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._round = 0

    def start(self) -> None:
        self.round()  # one served round before the fuzzing starts: the canary's own set-up is not a hang
        self._thread.start()

    def stop(self) -> None:
        """Stop the rounds, run one last round (after the fuzzing), close the clients."""
        self._stop.set()
        self._thread.join()
        self.round()
        self._consumer.close()
        del self._producer  # destroyed now: it would complain about the stopped broker until collected

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.round()

    def round(self) -> None:
        """One canary round; failures go to the report."""
        proc = self._broker.proc
        if proc is not None and proc.poll() is not None:
            self._report.crashes += 1
            self._report.hangs.append(f"broker exited with code {proc.returncode}; restarted")
            self._broker.start()
            return
        if proc is not None:
            self._report.peak_rss_kb = max(self._report.peak_rss_kb, _rss_kb(proc.pid, "VmHWM"))
        self._round += 1
        for step in (self._produce_consume, self._metadata):
            problem = step()
            if problem is not None:
                self._report.hangs.append(f"round {self._round}: {problem}")
        self._report.canary_rounds += 1
        if self._round % JANITOR_ROUNDS == 0:
            self._report.topics_deleted += clean_up(self._broker, self._topic, self._hang_s)

    def _produce_consume(self) -> str | None:
        value = f"canary-{self._round}".encode()
        errors: list[str] = []
        self._producer.produce(self._topic, value=value,
                               on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        if self._producer.flush(self._hang_s) != 0 or errors:
            return f"produce not acknowledged within {self._hang_s} s {errors[:1]}"
        deadline = time.monotonic() + self._hang_s
        while time.monotonic() < deadline:
            msg = self._consumer.poll(0.2)
            if msg is not None and not msg.error() and msg.value() == value:
                return None
        return f"record not consumed within {self._hang_s} s"

    def _metadata(self) -> str | None:
        from tests.helpers.wire import RawClient

        try:
            with RawClient(self._broker.bootstrap, timeout=self._hang_s) as c:
                resp = c.request(codec.ApiKey.Metadata, 1, topics=None)
                if not resp.brokers:
                    return "Metadata without brokers"
        except OSError as e:
            return f"Metadata on a fresh connection: {e!r}"
        return None


_HANDLER_FAILED = re.compile(r"handler for API key (\d+) v(\d+) .* failed")
_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d ")
_PROJECT_FRAME = re.compile(r'File ".*/((?:tabletopic|worker|coordinator|configs)/[^"]+)", line (\d+)')


def _traceback_of(lines: list[str], start: int) -> str:
    """The exception line of the traceback after ``lines[start]`` and the project's innermost frame."""
    tb: list[str] = []
    for line in lines[start + 1:start + 200]:
        if _RECORD_START.match(line):
            break
        tb.append(line)
    frames = [m for m in map(_PROJECT_FRAME.search, tb) if m]
    where = f" at {frames[-1].group(1)}:{frames[-1].group(2)}" if frames else ""
    return (tb[-1].strip()[:160] if tb else "?") + where


def scan_log(text: str, report: Report) -> None:
    """Handler exceptions by API key (the exception and where it was raised) and other ERROR records."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _HANDLER_FAILED.search(line)
        if m:
            report.handler_errors[(int(m.group(1)), _traceback_of(lines, i))] += 1
        elif " ERROR " in line:
            report.other_errors[re.sub(r"\d+", "N", line)[:160]] += 1


JANITOR_ROUNDS = 5
"""Every this many canary rounds the topics and groups the fuzz frames created are deleted: the broker's state
stays small, so that its RSS shows leaks rather than the thousands of topics Kafka would keep as well."""


def clean_up(broker: BrokerProcess, canary_topic: str, timeout: float) -> int:
    """Delete every topic and consumer group but the fuzzer's own and the internal ones; returns the topics
    deleted. Best effort: failures here are the fuzz frames' doing (a group they keep alive...), not hangs."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        topics = [t for t in admin.list_topics(timeout=timeout).topics
                  if t not in (*FUZZ_TOPICS, canary_topic) and not t.startswith("__")]
        for future in admin.delete_topics(topics, operation_timeout=timeout).values() if topics else ():
            future.exception(timeout)
        groups = [g.group_id for g in admin.list_consumer_groups().result(timeout).valid if g.group_id != canary_topic]
        for future in admin.delete_consumer_groups(groups).values() if groups else ():
            future.exception(timeout)
    except Exception:  # the broker's answer to the janitor is not what the fuzzer checks
        return 0
    return len(topics)


def _setup_topics(broker: BrokerProcess, canary_topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(t, 2, 1) for t in (*FUZZ_TOPICS, canary_topic)])
    for f in futures.values():
        f.result(timeout=30)


def _frame_source(opts: Options, report: Report) -> Iterator[Frame]:
    """Frames without end: batches of schema-generated frames (each batch a new hypothesis seed), each followed by
    its share of mutations of the frames generated so far (a bounded corpus) and of garbage."""
    rng = random.Random(opts.seed)
    pairs = api_versions()
    corpus: list[bytes] = []
    batch = 1000
    mutated_per_valid = (1 - opts.valid_share) / opts.valid_share
    for chunk in range(1 << 62):
        drawn = generate_valid(batch, opts.seed * 1_000_003 + chunk)
        rng.shuffle(drawn)
        report.unencodable += batch - len(drawn)
        for api_key, version, data in drawn:
            report.by_api[(api_key, version)] += 1
            if len(corpus) < 5000:
                corpus.append(data)
            else:
                corpus[rng.randrange(5000)] = data
            yield Frame(data, "valid")
            for _ in range(int(mutated_per_valid) + (rng.random() < mutated_per_valid % 1)):
                if rng.random() < opts.garbage_share / (1 - opts.valid_share):
                    yield garbage(rng, pairs)
                else:
                    yield mutate(rng, rng.choice(corpus), pairs)


def _fuzz(opts: Options, broker: BrokerProcess, report: Report) -> None:
    """Send frames until ``opts.frames`` or ``opts.seconds``; measures RSS after the first tenth of either (the
    warm-up)."""
    conns = [FuzzConnection(broker.bootstrap, report) for _ in range(opts.connections)]
    rng = random.Random(opts.seed + 1)
    t0 = time.monotonic()
    warm = max(1, opts.frames // 10)
    progress = 0.0
    for frame in _frame_source(opts, report):
        rng.choice(conns).send(frame)
        report.frames += 1
        report.by_kind[frame.kind.split("+")[0]] += 1
        elapsed = time.monotonic() - t0
        # the warm-up: the first tenth of the frames, or of the time when the run is timed
        warmed = report.frames >= warm or (opts.seconds and elapsed >= opts.seconds / 10)
        if warmed and not report.rss_start_kb and broker.proc is not None:
            report.rss_start_kb = _rss_kb(broker.proc.pid)
        if report.frames >= opts.frames or (opts.seconds and elapsed >= opts.seconds):
            break
        if not opts.quiet and elapsed - progress >= 30:
            progress = elapsed
            rss = _rss_kb(broker.proc.pid) // 1024 if broker.proc is not None else 0
            print(f"[{elapsed:.0f} s] {report.frames} frames, {report.reconnects} reconnects, "
                  f"{len(report.hangs)} hangs, {report.crashes} crashes, RSS {rss} MB", flush=True)
    for c in conns:
        c.close()
    report.seconds = time.monotonic() - t0


def run(opts: Options) -> Report:
    """One fuzz run against a broker of its own (in ``opts.data_dir`` or a temporary directory)."""
    report = Report()
    with tempfile.TemporaryDirectory(prefix="kafka-fuzz-") as tmp:
        broker = BrokerProcess((opts.data_dir or Path(tmp)) / "data")
        broker.start()
        try:
            canary_topic = f"canary-{uuid.uuid4().hex[:8]}"
            _setup_topics(broker, canary_topic)
            canary = Canary(broker, canary_topic, report, opts.hang_s)
            canary.start()
            try:
                _fuzz(opts, broker, report)
            finally:
                canary.stop()
            if broker.proc is not None:
                report.rss_end_kb = _rss_kb(broker.proc.pid)
                report.peak_rss_kb = max(report.peak_rss_kb, _rss_kb(broker.proc.pid, "VmHWM"))
        finally:
            broker.stop()
            scan_log(broker.log_text(), report)
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: ``--frames N`` and/or ``--seconds S``; exit code 1 when the broker crashed or hung."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--frames", type=int, default=None, help="frames to send (default 20000 without --seconds)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this many seconds (0: no limit)")
    p.add_argument("--connections", type=int, default=4, help="concurrent fuzz connections (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mutations and of hypothesis' draws")
    p.add_argument("--hang-seconds", type=float, default=10.0, help="a canary step slower than this is a hang")
    p.add_argument("--data-dir", type=Path, default=None, help="keep the broker's data and log here")
    args = p.parse_args(argv)
    frames = args.frames if args.frames is not None else (1 << 62 if args.seconds else 20_000)
    report = run(Options(frames=frames, seconds=args.seconds, connections=args.connections, seed=args.seed,
                         hang_s=args.hang_seconds, data_dir=args.data_dir))
    print(report.summary())
    return 1 if report.crashes or report.hangs else 0


if __name__ == "__main__":
    sys.exit(main())
