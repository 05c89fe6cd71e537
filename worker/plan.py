"""The conversion plan: which converter feeds which table column, which transform follows, and the table's columns.

Seam: :meth:`ConversionPlan.build` (how columns get their converters is listed there), on the event loop from the
table's schema and the topic's settings, once per commit round and per pre-write pass; every pool task of that
round gets the plan, and :meth:`ConversionPlan.context` gives a converter what it needs besides the bytes.

Rules: the plan is small and picklable: converters and the transform travel by registry name and are looked up
in the pool process. Columns follow the *table's* schema, matched by name, so a table whose schema someone else
changed still gets what it can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType

from configs.table_schema import KEY, VALUE
from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from coordinator.contract import ChangeMode
from worker.changes import CHANGE_FIELDS
from worker.converters import FALLBACKS, RecordPart, converter
from worker.converters.base import ConvertContext
from worker.converters.raw import RAW
from worker.converters.schemaless import SCHEMALESS
from worker.formats.base import RegistrySchema
from worker.transforms import value_transform
from worker.transforms.flatten import ROOT
from worker.transforms.none import NONE

LEGACY_KEY, LEGACY_VALUE, LEGACY_TIMESTAMP = "key", "value", "timestamp"


@dataclass(frozen=True, slots=True)
class ColumnFeed:
    """A table column filled from a record part by a converter (by registry name)."""

    column: str
    part: RecordPart
    converter: str


@dataclass(frozen=True, slots=True)
class ConversionPlan:
    """What a pool task needs to convert a chunk for one table (:meth:`build`)."""

    schema: Schema  # the table's (its field ids end up in the Arrow field metadata)
    arrow_schema: pa.Schema  # ``schema_to_pyarrow(schema, include_field_ids=True)``
    feeds: tuple[ColumnFeed, ...]  # key order first: a row's first reason for being bad is the key's
    value_transform: str = "none"  # by registry name
    tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA
    # schema-driven converters: the registry schemas fetched so far (None: the registry does not know the id)
    schemas: Mapping[int, RegistrySchema | None] = field(default_factory=dict)
    latest: Mapping[RecordPart, RegistrySchema | None] = field(default_factory=dict)  # by_latest_schema
    messages: Mapping[RecordPart, str | None] = field(default_factory=dict)  # Protobuf message full names
    # an upsert/CDC table's round: the rows become changes (worker.changes), keyed and read as it says
    change: ChangeMode | None = None
    # ``schema.type=schemaless``: the record also fills the legacy ``key``/``value``/``timestamp`` columns. Only
    # then: on any other table those are ordinary column names (a flattened value's fields ``key``, ``value``,
    # ``timestamp`` among them), filled from the value like any other field.
    legacy: bool = False
    # read_committed: (producer id, first offset) of the aborted transactions in the range the chunks read, whose
    # records never reach the table (set by the worker from its log; empty where there are none)
    aborted: tuple[tuple[int, int], ...] = ()

    @property
    def row_schema(self) -> pa.Schema:
        """The converted rows' schema: the table's, plus the change columns for an upsert/CDC table."""
        return self.arrow_schema if self.change is None else pa.schema([*self.arrow_schema, *CHANGE_FIELDS])

    @classmethod
    def build(cls, schema: Schema, cfg: TableTopicConfig, tolerance: ErrorsTolerance | None = None, *,
              schemas: Mapping[int, RegistrySchema | None] | None = None,
              latest: Mapping[RecordPart, RegistrySchema | None] | None = None,
              change: ChangeMode | None = None) -> ConversionPlan:
        """The plan for a table of ``schema`` under ``cfg`` (``tolerance`` overrides ``cfg.errors_tolerance``);
        ``change``: the round's change mode (the request's, for an upsert/CDC table).

        The record's key feeds ``_kafka_key``, its value ``_kafka_value`` (for ``schema.type=schemaless`` also the
        legacy ``key`` and ``value``; on other tables those are ordinary column names), or with a flattening
        transform (``flatten``) the table's top level: the converter's struct goes under
        :data:`~worker.transforms.flatten.ROOT` and the transform lifts its fields into columns. Each such column
        gets the converter its setting names (``convert.key.type`` / ``convert.value.type``; the legacy columns
        the schemaless handling) when that converter produces the column's type; otherwise the first of
        :data:`worker.converters.FALLBACKS` that does, else raw bytes.
        """
        names = {f.name: f.field_type for f in schema.fields}
        legacy = cfg.legacy_columns
        wanted: tuple[tuple[str, RecordPart, str], ...] = (
            (KEY, RecordPart.KEY, str(cfg.convert_key_type)),
            *(((LEGACY_KEY, RecordPart.KEY, SCHEMALESS.name),) if legacy else ()),
            (VALUE, RecordPart.VALUE, str(cfg.convert_value_type)),
            *(((LEGACY_VALUE, RecordPart.VALUE, SCHEMALESS.name),) if legacy else ()))
        transform = _transform_for(str(cfg.transform_value_type))
        if value_transform(transform).flattens:  # the value's fields are top-level columns
            wanted = tuple((ROOT if column == VALUE else column, part, configured)
                           for column, part, configured in wanted)
        feeds = tuple(ColumnFeed(column, part, _converter_for(configured, names.get(column)))
                      for column, part, configured in wanted if column in names or _schema_driven(configured))
        return cls(schema=schema, arrow_schema=schema_to_pyarrow(schema, include_field_ids=True), feeds=feeds,
                   value_transform=transform,
                   tolerance=cfg.errors_tolerance if tolerance is None else tolerance,
                   schemas=dict(schemas or {}), latest=dict(latest or {}),
                   messages={RecordPart.KEY: cfg.key_message_full_name,
                             RecordPart.VALUE: cfg.value_message_full_name},
                   change=change, legacy=legacy)

    def context(self, feed: ColumnFeed) -> ConvertContext:
        """What the converter of ``feed`` is given besides the bytes."""
        return ConvertContext(column=None if feed.column == ROOT else feed.column, table_schema=self.schema,
                              schemas=self.schemas, latest=self.latest.get(feed.part),
                              message=self.messages.get(feed.part),
                              transform=self.value_transform if feed.part is RecordPart.VALUE else NONE.name)


def latest_subjects(topic: str, cfg: TableTopicConfig) -> dict[RecordPart, str]:
    """The registry subject of each record part read with ``by_latest_schema`` (``<topic>-key`` /
    ``<topic>-value`` unless ``convert.*.by_latest_schema.subject`` names one)."""
    out: dict[RecordPart, str] = {}
    if cfg.convert_key_type is ConvertType.BY_LATEST_SCHEMA:
        out[RecordPart.KEY] = cfg.key_subject_override or f"{topic}-key"
    if cfg.convert_value_type is ConvertType.BY_LATEST_SCHEMA:
        out[RecordPart.VALUE] = cfg.value_subject_override or f"{topic}-value"
    return out


def _transform_for(configured: str) -> str:
    # A transform this broker does not have can only be a value stored before the config checks refused it: the
    # records are written untransformed, as before those checks existed.
    try:
        return value_transform(configured).name
    except KeyError:
        return NONE.name


def _schema_driven(name: str) -> bool:
    """True for converters whose column type comes from the records' schemas (they evolve the table)."""
    try:
        return converter(name).iceberg_type is None
    except KeyError:
        return False


def _converter_for(configured: str, column_type: IcebergType | None) -> str:
    try:
        produced = converter(configured).iceberg_type
        if produced is None or produced == column_type:
            return configured
    except KeyError:  # a converter this broker does not have (refused by the config checks since)
        pass
    return next((c.name for c in FALLBACKS if c.iceberg_type == column_type), RAW.name)
