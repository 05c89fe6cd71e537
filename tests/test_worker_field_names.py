"""Every field name a format allows lands in its own column with its own value (property-based, pure: a real SQLite
catalog and the worker's conversion, the table evolved as the coordinator would). The names the legacy schemaless
layout uses (``key``, ``value``, ``timestamp``), names that differ only by case, dots, spaces and any Unicode are
drawn often; the record columns' own names (``_kafka_header``, ``_kafka_key``, ``_kafka_metadata``) are bad data
by design (``reserved_field``) and left out."""

from __future__ import annotations

import io
import json
import struct
import tempfile
from typing import Any

import fastavro
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from configs.table_schema import table_schema
from configs.table_topic import ConvertType, TableTopicConfig, TransformType
from tests.test_worker_support import make_batch
from worker.convert import ConvertResult, convert_records
from worker.formats.base import RegistrySchema
from worker.plan import ConversionPlan

RESERVED = {"_kafka_header", "_kafka_key", "_kafka_metadata"}
LEGACY = ["key", "value", "timestamp", "Key", "VALUE"]
JSON_NAMES = st.one_of(st.sampled_from([*LEGACY, "Dup", "dup", "a.b", "a b", "we`ird", "ünï", "名前", "x" * 60]),
                       st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
                       ).filter(lambda n: n not in RESERVED)
AVRO_NAMES = st.one_of(st.sampled_from([*LEGACY, "Dup", "dup", "_", "_kafka_keys"]),
                       st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
                       ).filter(lambda n: n not in RESERVED)
CONFIGS = {"json": TableTopicConfig(convert_value_type=ConvertType.JSON, transform_value_type=TransformType.FLATTEN),
           "avro": TableTopicConfig(convert_value_type=ConvertType.BY_SCHEMA_ID,
                                    transform_value_type=TransformType.FLATTEN)}


def _table(tmp: str, cfg: TableTopicConfig) -> Table:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp}/cat.db", warehouse=f"file://{tmp}/wh")
    cat.create_namespace("default")
    return cat.create_table("default.t", schema=table_schema(cfg))


def _convert_evolving(tbl: Table, cfg: TableTopicConfig, data: bytes,
                      schemas: dict[int, RegistrySchema | None] | None = None) -> ConvertResult:
    """Convert ``data``, evolving the table by each change the conversion asks for (as the coordinator does)."""
    for _ in range(4):
        r = convert_records(data, partition=0, start_offset=0,
                            plan=ConversionPlan.build(tbl.schema(), cfg, schemas=schemas or {}))
        if r.stats.table_change is None:
            return r
        with tbl.update_schema() as u:
            u.union_by_name(Schema.model_validate_json(r.stats.table_change))
        tbl = tbl.refresh()
    raise AssertionError("the table kept asking for changes")


def _check(r: ConvertResult, docs: list[dict[str, Any]]) -> None:
    assert r.stats.skipped == {} and r.stats.records == len(docs), r.stats
    rows = r.table.to_pylist()
    for i, (row, doc) in enumerate(zip(rows, docs, strict=True)):
        assert {name: row[name] for name in doc} == doc
        assert row["_kafka_key"] == f"k{i}" and row["_kafka_metadata"]["offset"] == i


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(JSON_NAMES, min_size=1, max_size=5, unique=True), min_size=1, max_size=3),
       st.integers(-(2**40), 2**40))
def test_plain_json_fields_of_any_name(records: list[list[str]], base: int) -> None:
    docs = [{name: base + 7 * j + i for j, name in enumerate(names)} for i, names in enumerate(records)]
    with tempfile.TemporaryDirectory() as tmp:
        tbl = _table(tmp, CONFIGS["json"])
        data = bytes(make_batch([(b"k%d" % i, json.dumps(d).encode(), [], 1000 + i) for i, d in enumerate(docs)]))
        r = _convert_evolving(tbl, CONFIGS["json"], data)
    # a record lacks the others' fields: they are null in its row
    _check(r, docs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(AVRO_NAMES, min_size=1, max_size=6, unique=True), st.integers(-(2**40), 2**40))
def test_avro_fields_of_any_name(names: list[str], base: int) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": n, "type": "long"} for n in names]}
    docs = [{n: base + 7 * j + i for j, n in enumerate(names)} for i in range(3)]
    values = []
    for d in docs:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), d)
        values.append(b"\x00" + struct.pack(">i", 5) + buf.getvalue())
    known: dict[int, RegistrySchema | None] = {5: RegistrySchema("AVRO", json.dumps(schema), schema_id=5)}
    with tempfile.TemporaryDirectory() as tmp:
        tbl = _table(tmp, CONFIGS["avro"])
        data = bytes(make_batch([(b"k%d" % i, v, [], 1000 + i) for i, v in enumerate(values)]))
        r = _convert_evolving(tbl, CONFIGS["avro"], data, known)
    _check(r, docs)
