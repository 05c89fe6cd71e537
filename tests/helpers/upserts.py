"""Shared helpers of the upsert/CDC table-topic tests: a change stream with its model of the table (the latest row
per live key), waiting until the table has committed the whole log, and the table read by pyiceberg and DuckDB."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka import Consumer, Producer, TopicPartition
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from coordinator.contract import CHANGE_FILE_PREFIX
from coordinator.table import committed_offsets
from tabletopic.fileio import local_path
from tabletopic.readers import duckdb_connect, duckdb_scan
from tests.helpers.procs import BrokerProcess

Key = tuple[Any, ...]
CATALOG_PREFIX = "automq.table.topic.catalog."


class JsonChanges:
    """JSON changes to a topic keyed by ``id`` (the Kafka key is the id: a key's changes share a partition), and the
    model of the table they make: ``model[id]`` is the latest row of every live key (an op ``D`` removes it)."""

    def __init__(self, b: BrokerProcess, topic: str, *, upsert: bool = True) -> None:
        self.topic = topic
        self.upsert = upsert
        self.producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5,
                                  "enable.idempotence": True})
        self.model: dict[int, dict[str, Any]] = {}
        self.sent = 0

    def send(self, value: dict[str, Any] | None, key: bytes | None = None) -> None:
        raw = None if value is None else json.dumps(value).encode()
        if key is None and value is not None and value.get("id") is not None:
            key = str(value["id"]).encode()
        while True:
            try:
                self.producer.produce(self.topic, key=key, value=raw)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)
        self.sent += 1

    def change(self, op: str | None, i: int, **fields: Any) -> None:
        """A change of key ``i`` with AutoMQ's op field (``None``: no op field) and the row's other fields."""
        value = {"id": i, **fields}
        if op is not None:
            value["op"] = op
        self.send(value)
        first = (op or ("U" if self.upsert else "I"))[:1].upper()
        if first == "D":
            self.model.pop(i, None)
        else:
            self.model[i] = {"id": i, **fields}

    def flush(self) -> None:
        assert self.producer.flush(60) == 0


def catalog(b: BrokerProcess) -> Catalog:
    """The broker's catalog: its embedded SQLite catalog, or the one its ``automq.table.topic.catalog.*`` overrides
    name (a REST catalog over S3, say)."""
    props = {k[len(CATALOG_PREFIX):]: v for k, v in b.overrides.items() if k.startswith(CATALOG_PREFIX)}
    if props.pop("type", "sql") != "sql":
        return load_catalog("tabletopic", **props)
    return SqlCatalog("tabletopic", **{"uri": b.catalog_uri, "warehouse": b.warehouse, **props})


def end_offsets(b: BrokerProcess, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "probe-" + uuid.uuid4().hex})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def wait_committed(b: BrokerProcess, topic: str, timeout: float = 240,
                   alive: Callable[[], bool] | None = None) -> Table:
    """The topic's table once its committed offsets reach the log's end offsets (every record applied)."""
    ends = {p: o for p, o in end_offsets(b, topic).items() if o > 0}
    cat = catalog(b)
    deadline = time.monotonic() + timeout
    offsets: dict[int, int] = {}
    while time.monotonic() < deadline:
        assert alive is None or alive(), "the broker is gone"
        try:
            tbl = cat.load_table(("default", topic))
        except NoSuchTableError:
            time.sleep(0.3)
            continue
        offsets = committed_offsets(tbl)
        if all(offsets.get(p, 0) >= o for p, o in ends.items()):
            return tbl
        time.sleep(0.3)
    raise AssertionError(f"{topic}: committed {offsets}, log ends at {ends}")


def maintenance_run_path(b: BrokerProcess, topic: str) -> Path:
    """Where the broker records the topic's last maintenance run (JSON)."""
    return b.data_dir / "__tables" / topic / "maintenance.json"


def last_maintenance_run(b: BrokerProcess, topic: str) -> dict[str, Any] | None:
    """The record of the topic's last maintenance run; None before the first."""
    runs = maintenance_run_path(b, topic)
    if not runs.exists():
        return None
    run: dict[str, Any] = json.loads(runs.read_text())
    return run


def wait_maintenance_run(b: BrokerProcess, topic: str, note: str, timeout: float = 120,
                         until: Callable[[dict[str, Any]], bool] = lambda run: True) -> dict[str, Any]:
    """The record of the topic's last maintenance run, once there is one for which ``until`` holds (``note`` says
    what was expected)."""
    deadline = time.monotonic() + timeout
    run = last_maintenance_run(b, topic)
    while (run is None or not until(run)) and time.monotonic() < deadline:
        time.sleep(0.5)
        run = last_maintenance_run(b, topic)
    assert run is not None and until(run), f"{topic}: no such maintenance run within {timeout:.0f} s ({note}): {run}"
    return run


def keyed_rows(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> dict[Any, tuple[Any, ...]]:
    """``rows`` by their first column (the key), each as its ``columns``; asserts one row per key."""
    out: dict[Any, tuple[Any, ...]] = {}
    for r in rows:
        key = r[columns[0]]
        assert key not in out, f"key {key} twice: {out[key]} and {r}"
        out[key] = tuple(r.get(c) for c in columns)
    return out


def pyiceberg_view(tbl: Table, columns: tuple[str, ...]) -> dict[Any, tuple[Any, ...]]:
    return keyed_rows(tbl.scan(selected_fields=columns).to_arrow().to_pylist(), columns)


def duckdb_view(tbl: Table, columns: tuple[str, ...]) -> dict[Any, tuple[Any, ...]]:
    con = duckdb_connect()
    try:
        rel = duckdb_scan(con, tbl).select(", ".join(f'"{c}"' for c in columns))
        return keyed_rows([dict(zip(columns, row, strict=True)) for row in rel.fetchall()], columns)
    finally:
        con.close()


def model_view(model: dict[Any, dict[str, Any]], columns: tuple[str, ...]) -> dict[Any, tuple[Any, ...]]:
    return {k: tuple(row.get(c) for c in columns) for k, row in model.items()}


def delete_file_contents(tbl: Table) -> dict[int, int]:
    """The table's live files by content (0 data, 1 position deletes, 2 equality deletes): how many of each."""
    out: dict[int, int] = {}
    for entry in tbl.inspect.files().to_pylist():
        out[entry["content"]] = out.get(entry["content"], 0) + 1
    return out


def parquet_codecs(tbl: Table) -> dict[int, set[str]]:
    """The compression codecs of the table's live files' column chunks, by content (read from their footers)."""
    import pyarrow.parquet as pq

    out: dict[int, set[str]] = {}
    for entry in tbl.inspect.files().to_pylist():
        with tbl.io.new_input(entry["file_path"]).open() as f:
            meta = pq.ParquetFile(f).metadata
        out.setdefault(entry["content"], set()).update(
            meta.row_group(g).column(c).compression for g in range(meta.num_row_groups)
            for c in range(meta.num_columns))
    return out


def change_files_on_disk(tbl: Table) -> list[str]:
    """Change files still under the table's location, local or in an object store (none once no round is in
    flight), listed through the table's FileIO."""
    from pyarrow.fs import FileSelector

    parts = urlsplit(tbl.location())
    local = local_path(tbl.location())
    fs = tbl.io.fs_by_scheme(parts.scheme or "file", parts.netloc)  # type: ignore[attr-defined]
    root = str(local) if local is not None else parts.netloc + parts.path
    infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.base_name.startswith(CHANGE_FILE_PREFIX))


def assert_table(b: BrokerProcess, topic: str, model: dict[Any, dict[str, Any]], columns: tuple[str, ...],
                 timeout: float = 300) -> Table:
    """Once the table has committed the whole log: pyiceberg and DuckDB each return one row per live key of the
    model, with its values; no equality deletes; no change file left. Returns the table."""
    tbl = wait_committed(b, topic, timeout, alive=lambda: b.proc is not None and b.proc.poll() is None)
    want = model_view(model, columns)
    assert pyiceberg_view(tbl, columns) == want
    assert duckdb_view(tbl, columns) == want
    assert delete_file_contents(tbl).get(2, 0) == 0, "equality deletes"
    assert change_files_on_disk(tbl) == []
    return tbl


def through_crash_points(b: BrokerProcess, topic: str, points: tuple[str, ...], create: Callable[[], None],
                         changes: Callable[[JsonChanges, int], None]) -> JsonChanges:
    """Start the broker armed with each crash point in turn (``create`` the topic at the first start), produce
    ``changes(s, n)`` (the n-th point's) until it dies there, then start it unarmed and produce some more; returns
    the last stream, whose model holds every change (the broker still runs)."""
    s: JsonChanges | None = None
    model: dict[int, dict[str, Any]] = {}
    for n, point in enumerate(points):
        b.env = {"TABLETOPIC_CRASH_AT": point}
        b.start()
        if s is None:
            create()
        else:
            s.flush()  # what the crash interrupted (idempotent: each record once)
        s = JsonChanges(b, topic)
        s.model = model
        changes(s, n)
        s.producer.flush(10)
        assert b.wait_exit(300) == 137, point
        assert f"crash point {point} reached" in b.log_text()
    b.env = {}
    b.start()
    assert s is not None
    s.flush()
    s = JsonChanges(b, topic)
    s.model = model
    changes(s, len(points))
    s.flush()
    return s
