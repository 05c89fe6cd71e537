"""Avro payloads (Confluent header already taken off) → an Arrow column of the schema's Iceberg type.

Seam: :func:`decode` (and :func:`decode_table` for a record schema) takes the fast path first,
:mod:`worker.formats.avro_duckdb` (DuckDB's Avro reader, straight into Arrow columns), and decodes every chunk
that path hands back record by record with fastavro (:func:`decode_fastavro`), which names the bad rows. The
rates of both paths: docs/benchmarks.md#decoding.

Rules: both paths give the same values of the same Arrow type. A payload that does not decode is a bad row with a
reason (``undecodable_avro_<suffix>``, ``trailing_bytes_<suffix>``) and a detail, never an exception for the
chunk.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

from worker.converters.base import ConvertedColumn
from worker.formats import avro_duckdb
from worker.formats.avro_arrow import arrow_type, storage_type
from worker.formats.avro_schema import AvroColumns
from worker.formats.base import error_detail

REASON_UNDECODABLE = "undecodable_avro"
# the value decoded before the payload's end (fastavro ignores the rest): format-independent, as Protobuf and JSON
# name such payloads by their own reasons
REASON_TRAILING = "trailing_bytes"
DUCKDB = True  # try the DuckDB path first (False: fastavro only)


def _build(values: list[Any], typ: pa.DataType) -> pa.Array:
    built = pa.array(values, storage_type(typ))
    # pa.array leaves the field ids off a map's key and value fields: the cast puts them back
    return built if built.type.equals(typ, check_metadata=True) else built.cast(typ)


def _read(payload: bytes, columns: AvroColumns) -> tuple[Any, int]:
    """(the value, the number of bytes it took)."""
    buf = io.BytesIO(payload)
    value = fastavro.schemaless_reader(buf, columns.decode_schema, None,
                                       return_record_name=True, return_record_name_override=True)
    return value, buf.tell()


def left_over(end: int, size: int) -> str:
    """The detail of a payload whose value ended at byte ``end`` of ``size``."""
    return f"the value ends at byte {end} of {size}: {size - end} bytes left over"


def decode(payloads: pa.Array, columns: AvroColumns, suffix: str) -> ConvertedColumn:
    """Decode every payload of ``payloads`` (binary, null for rows already bad); ``suffix`` ends the reasons.

    Null payloads stay null without a reason of their own (the framing has given one).
    """
    if DUCKDB:
        fast = avro_duckdb.decode(payloads, columns)
        if fast is not None:
            return fast
    return decode_fastavro(payloads, columns, suffix)


def decode_fastavro(payloads: pa.Array, columns: AvroColumns, suffix: str) -> ConvertedColumn:
    """:func:`decode` record by record with fastavro (names the bad rows): ``schemaless_reader`` against the writer
    schema of :func:`worker.formats.avro_schema.avro_columns`, the value turned into what the Arrow column takes
    (only where it differs: union members, uuids), the column built in one ``pa.array`` call.

    A payload that does not decode (cut, garbage, a string that is not UTF-8) is bad (``undecodable_avro``); so is
    one with bytes left after its value (``trailing_bytes``: fastavro stops after the value, and a
    Confluent-framed payload read as plain Avro, or two payloads in one, usually decode that far into garbage).
    Both come with a detail (the exception, where the value ended)."""
    reason = f"{REASON_UNDECODABLE}_{suffix}"
    typ = arrow_type(columns)
    bad: dict[int, str] = {}
    details: dict[int, str] = {}
    values: list[Any] = []
    for i, payload in enumerate(payloads.to_pylist()):
        value = None
        if payload is not None:
            try:
                read, end = _read(payload, columns)
                if end == len(payload):
                    value = columns.fix(read)
                else:  # fastavro stops after the value: the rest is another format's bytes, or garbage
                    bad[i], details[i] = f"{REASON_TRAILING}_{suffix}", left_over(end, len(payload))
            except Exception as e:  # bad input: fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
                bad[i], details[i] = reason, error_detail(e)
        values.append(value)
    try:
        return ConvertedColumn(_build(values, typ), bad, details=details)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    # A value Arrow refuses (a decimal wider than its precision, a date out of range): find the rows one by one.
    for i, v in enumerate(values):
        try:
            _build([v], typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            bad[i], details[i] = reason, f"a value the column cannot hold: {error_detail(e)}"
            values[i] = None
    return ConvertedColumn(_build(values, typ), bad, details=details)


def decode_table(payloads: pa.Array, columns: AvroColumns, suffix: str) -> tuple[pa.Table, dict[int, str]]:
    """:func:`decode` for a record schema: a table of the record's fields (field ids in the metadata) holding the
    rows that decoded, in order, and the reasons of the others (by row of ``payloads``)."""
    out = decode(payloads, columns, suffix)
    schema = schema_to_pyarrow(columns.schema, include_field_ids=True)
    good = out.values.filter(out.values.is_valid())
    return pa.Table.from_struct_array(good).cast(schema), dict(out.bad)
