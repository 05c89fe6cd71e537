"""Debezium change events as Debezium 2.x writes them with Confluent's AvroConverter: the envelope, key and
source-block Avro schemas of its PostgreSQL and MySQL connectors (``connect.*`` properties included), and the
event values of each op (a snapshot read ``r``, ``c``, ``u``, ``d``, a PostgreSQL truncate ``t``).

PostgreSQL tables here have the default replica identity: an update has no ``before``, a delete's ``before``
holds only the key columns. MySQL (binlog row images) gives full ``before`` rows. The source block names the
database (``db``), PostgreSQL also the ``schema``, and the ``table``.
"""

from __future__ import annotations

from typing import Any

_ENUM = {"type": "string", "connect.version": 1, "connect.parameters": {"allowed": "true,last,false,incremental"},
         "connect.default": "false", "connect.name": "io.debezium.data.Enum"}
_COMMON_SOURCE = [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
    {"name": "snapshot", "type": [_ENUM, "null"], "default": "false"},
    {"name": "db", "type": "string"}, {"name": "sequence", "type": ["null", "string"], "default": None},
    {"name": "ts_us", "type": ["null", "long"], "default": None},
    {"name": "ts_ns", "type": ["null", "long"], "default": None},
]
PG_SOURCE: dict[str, Any] = {
    "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
    "fields": [*_COMMON_SOURCE, {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
               {"name": "txId", "type": ["null", "long"], "default": None},
               {"name": "lsn", "type": ["null", "long"], "default": None},
               {"name": "xmin", "type": ["null", "long"], "default": None}],
    "connect.name": "io.debezium.connector.postgresql.Source"}
MYSQL_SOURCE: dict[str, Any] = {
    "type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql",
    "fields": [*_COMMON_SOURCE, {"name": "table", "type": ["null", "string"], "default": None},
               {"name": "server_id", "type": "long"}, {"name": "gtid", "type": ["null", "string"], "default": None},
               {"name": "file", "type": "string"}, {"name": "pos", "type": "long"}, {"name": "row", "type": "int"},
               {"name": "thread", "type": ["null", "long"], "default": None},
               {"name": "query", "type": ["null", "string"], "default": None}],
    "connect.name": "io.debezium.connector.mysql.Source"}
_BLOCK = {"type": "record", "name": "block", "namespace": "event", "fields": [
    {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
    {"name": "data_collection_order", "type": "long"}], "connect.version": 1, "connect.name": "event.block"}

PG_COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": {"type": "int", "connect.default": 0}, "default": 0},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "price", "type": ["null", {"type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
                                        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                                        "connect.name": "org.apache.kafka.connect.data.Decimal",
                                        "logicalType": "decimal"}], "default": None},
    {"name": "created_at", "type": ["null", {"type": "long", "connect.version": 1,
                                             "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
]
MYSQL_COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": "int"}, {"name": "first_name", "type": "string"},
    {"name": "last_name", "type": "string"}, {"name": "email", "type": "string"},
]
NEW_COLUMN = {"name": "email", "type": ["null", "string"], "default": None}  # ALTER TABLE ... ADD COLUMN email


def envelope(prefix: str, source: dict[str, Any], columns: list[dict[str, Any]]) -> dict[str, Any]:
    """The value schema of topic ``prefix`` (``<topic.prefix>.<schema or db>.<table>``): Debezium's Envelope."""
    value = {"type": "record", "name": "Value", "fields": columns, "connect.name": f"{prefix}.Value"}
    return {"type": "record", "name": "Envelope", "namespace": prefix, "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": source},
        {"name": "transaction", "type": ["null", _BLOCK], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {"name": "ts_us", "type": ["null", "long"], "default": None},
        {"name": "ts_ns", "type": ["null", "long"], "default": None},
    ], "connect.version": 2, "connect.name": f"{prefix}.Envelope"}


def key_schema(prefix: str) -> dict[str, Any]:
    return {"type": "record", "name": "Key", "namespace": prefix, "fields": [{"name": "id", "type": "int"}],
            "connect.name": f"{prefix}.Key"}


def pg_source(table: str, ts_ms: int, *, snapshot: str = "false", lsn: int = 0) -> dict[str, Any]:
    return {"version": "2.7.3.Final", "connector": "postgresql", "name": "pg", "ts_ms": ts_ms, "snapshot": snapshot,
            "db": "shop", "sequence": f'["{lsn}","{lsn}"]', "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000,
            "schema": "public", "table": table, "txId": 700 + lsn, "lsn": lsn, "xmin": None}


def mysql_source(table: str, ts_ms: int, *, snapshot: str = "false", pos: int = 0) -> dict[str, Any]:
    return {"version": "2.7.3.Final", "connector": "mysql", "name": "mysql", "ts_ms": ts_ms, "snapshot": snapshot,
            "db": "inventory", "sequence": None, "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000,
            "table": table, "server_id": 223344, "gtid": None, "file": "mysql-bin.000003", "pos": pos, "row": 0,
            "thread": 7, "query": None}


def event(op: str, source: dict[str, Any], ts_ms: int, *, before: dict[str, Any] | None = None,
          after: dict[str, Any] | None = None) -> dict[str, Any]:
    """An envelope value; ``ts_ms`` is when the connector processed it (ts_us / ts_ns alongside, as 2.x writes)."""
    return {"before": before, "after": after, "source": source, "transaction": None, "op": op,
            "ts_ms": ts_ms, "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000}
