"""Converted rows → files of an Iceberg table, and the entries to commit them (pool side).

Seam: a :class:`FileWriter` turns a chunk's rows into :class:`WrittenFiles`; the picklable :class:`WriteTarget`
(built on the loop by :meth:`WriteTarget.from_table`) names the table and the writer (:func:`writer_for`,
:func:`writer_name`): ``append`` (:class:`AppendWriter`: data files, :func:`write_data_files`) or ``merge``
(:class:`ChangeWriter`, upsert/CDC tables: one change file per chunk, which the coordinator applies with a Spark
``MERGE INTO`` and never commits as such).

Rules: a data file holds rows of exactly one partition of the table's spec, carries the table schema's field ids
and pyiceberg's own statistics, and is fsynced before any commit can reference it. Files are named by
:func:`coordinator.contract.data_file_name`: the name's start offset is what the coordinator's clean-up relies on.
No writer commits delete files: the coordinator refuses answers carrying ``WrittenFiles.delete_files`` (Spark's
merge writes the deletes, never equality deletes, which pyiceberg cannot read).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    MetricsMode,
    StatisticsCollector,
    _get_parquet_writer_kwargs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    match_metrics_mode,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.transforms import Transform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import BinaryType, NestedField, PrimitiveType, StringType, StructType

from configs.table_topic import TableTopicConfig
from coordinator.contract import CHANGE_FILE_PREFIX, DATA_FILE_PREFIX, DeleteFile, data_file_name, set_file_spec_id
from tabletopic.fileio import DurableFileIO, fsync_file, local_path

TARGET_FILE_SIZE_DEFAULT = 64 * 1024 * 1024  # AutoMQ rolls at 64 MiB (pyiceberg's own default is 512 MB)
APPEND = "append"
MERGE = "merge"
# Record payloads are nearly always distinct: trying a dictionary first costs ~30% of the write time and gives
# bigger files once the writer falls back to plain encoding. Numbers are not dictionary-encoded either.
PAYLOAD_COLUMNS = frozenset({"_kafka_value", "value"})


@dataclass(frozen=True, slots=True)
class WriteTarget:
    """Everything a pool process needs to write files for one table; small and picklable.

    Build it on the event loop with :meth:`from_table`; the schema and spec must be the table's (field ids and
    spec id come from its metadata).
    """

    location: str
    schema: Schema
    spec: PartitionSpec
    properties: tuple[tuple[str, str], ...] = ()  # table properties
    io_properties: tuple[tuple[str, str], ...] = ()  # FileIO properties (table.io.properties)
    writer: str = APPEND  # the FileWriter (:func:`writer_for`)

    @classmethod
    def from_table(cls, table: Table, *, schema_id: int | None = None, spec_id: int | None = None,
                   writer: str = APPEND) -> WriteTarget:
        """From a table; its current schema/spec unless ids are given (KeyError if unknown)."""
        meta = table.metadata
        schema = meta.schema() if schema_id is None else table.schemas()[schema_id]
        spec = meta.spec() if spec_id is None else table.specs()[spec_id]
        return cls(
            location=meta.location,
            schema=schema,
            spec=spec,
            properties=tuple(sorted(meta.properties.items())),
            io_properties=tuple(sorted((str(k), str(v)) for k, v in table.io.properties.items())),
            writer=writer,
        )

    @property
    def props(self) -> dict[str, str]:
        return dict(self.properties)

    @property
    def target_file_size(self) -> int:
        raw = self.props.get(TableProperties.WRITE_TARGET_FILE_SIZE_BYTES)
        return int(raw) if raw else TARGET_FILE_SIZE_DEFAULT


@functools.lru_cache(maxsize=16)
def _file_io(io_properties: tuple[tuple[str, str], ...], location: str) -> FileIO:
    # one FileIO per pool process and table location (they hold filesystem clients worth reusing)
    return load_file_io(dict(io_properties), location)


def file_io_for(target: WriteTarget) -> FileIO:
    return _file_io(target.io_properties, target.location)


def _source_column(table: pa.Table, schema: Schema, source_id: int) -> pa.Array:
    """The (possibly nested) column ``source_id`` of ``table`` (laid out as ``schema``), nulls propagated."""
    accessor = schema.accessor_for_field(source_id)
    arr = table.column(accessor.position).combine_chunks()
    inner = accessor.inner
    while inner is not None:
        arr = pc.struct_field(arr, [inner.position])
        inner = inner.inner
    return arr


def _transform_input(arr: pa.Array, transform: Transform[Any, Any]) -> pa.Array:
    """``arr`` in a type pyiceberg's Arrow transform takes.

    pyiceberg-core's truncate has no kernel for large_binary (what binary columns are read as): slice the values to
    the width first (that is the truncation itself), which lets them fit plain binary.
    """
    if isinstance(transform, TruncateTransform) and pa.types.is_large_binary(arr.type):
        return pc.binary_slice(arr, 0, transform.width).cast(pa.binary())
    return arr


def split_by_partition(table: pa.Table, schema: Schema, spec: PartitionSpec
                       ) -> list[tuple[PartitionKey | None, pa.Table]]:
    """Rows of ``table`` grouped by partition (one hash pass; rows keep their order inside a group)."""
    if spec.is_unpartitioned() or table.num_rows == 0:
        return [(None, table)]
    names = [f"p{i}" for i in range(len(spec.fields))]
    keys: dict[str, pa.Array] = {}
    for name, pf in zip(names, spec.fields, strict=True):
        source_type = schema.find_field(pf.source_id).field_type
        keys[name] = pf.transform.pyarrow_transform(source_type)(
            _transform_input(_source_column(table, schema, pf.source_id), pf.transform))
    n = table.num_rows
    keys["__row"] = pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)
    groups = pa.table(keys).group_by(names, use_threads=False).aggregate([("__row", "list")])
    values = groups.select(names).to_pylist()
    rows = groups.column("__row_list")
    out: list[tuple[PartitionKey | None, pa.Table]] = []
    for i, value in enumerate(values):
        key = PartitionKey(
            field_values=[PartitionFieldValue(field=pf, value=value[name])
                          for name, pf in zip(names, spec.fields, strict=True)],
            partition_spec=spec,
            schema=schema,
        )
        part = table if len(values) == 1 else table.take(rows[i].values)
        out.append((key, part))
    return out


def _struct_leaves(fields: tuple[NestedField, ...], depth: int = 0) -> list[int]:
    out: list[int] = []
    for f in fields:
        if isinstance(f.field_type, StructType):
            out += _struct_leaves(f.field_type.fields, depth + 1)
        elif depth > 0 and isinstance(f.field_type, PrimitiveType):
            out.append(f.field_id)
    return out


def statistics_plan(schema: Schema, properties: dict[str, str]) -> dict[int, StatisticsCollector]:
    """pyiceberg's metrics plan, plus lower/upper bounds for primitives nested in structs only.

    pyiceberg keeps only counts for every nested column; Iceberg-Java also keeps bounds for struct members
    (not for list or map contents), and ``_kafka_metadata.offset`` / ``.timestamp`` are what readers filter on.
    """
    plan = compute_statistics_plan(schema, properties)
    default = properties.get(TableProperties.DEFAULT_WRITE_METRICS_MODE,
                             TableProperties.DEFAULT_WRITE_METRICS_MODE_DEFAULT)
    for field_id in _struct_leaves(schema.fields):
        col = plan.get(field_id)
        if col is None:
            continue
        mode = match_metrics_mode(properties.get(f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}."
                                                 f"{col.column_name}", default))
        if mode.type == MetricModeTypes.TRUNCATE and not isinstance(col.iceberg_type, StringType | BinaryType):
            mode = MetricsMode(MetricModeTypes.FULL)
        plan[field_id] = StatisticsCollector(field_id=field_id, iceberg_type=col.iceberg_type, mode=mode,
                                             column_name=col.column_name)
    return plan


def dictionary_columns(schema: Schema) -> list[str]:
    """Parquet column paths worth a dictionary: string/binary leaves outside the record payload columns."""
    out = []
    for path, field_id in parquet_path_to_id_mapping(schema).items():
        if path.split(".", 1)[0] in PAYLOAD_COLUMNS:
            continue
        if isinstance(schema.find_type(field_id), StringType | BinaryType):
            out.append(path)
    return out


def write_data_files(
    table: pa.Table,
    target: WriteTarget,
    *,
    partition: int,
    start_offset: int,
    io: FileIO | None = None,
    prefix: str = DATA_FILE_PREFIX,
) -> list[DataFile]:
    """Write ``table`` (already in ``schema_to_pyarrow(target.schema, include_field_ids=True)``) as data files.

    One or more files per table partition (rolled at the target size); returns their ``DataFile`` entries with
    the partition record and ``target.spec``'s id. Nothing is written for an empty table. ``prefix``: the file
    names' (:func:`coordinator.contract.data_file_name`), under the table's location provider (by default
    ``<location>/data/<partition path>/``).

    Partition transforms: identity, year, month, day, hour, bucket, truncate; sources may be nested struct fields.
    Files are compressed with ``write.parquet.compression-codec`` / ``write.parquet.compression-level`` (default
    zstd at the codec's default level) and rolled at ``write.target-file-size-bytes`` (default 64 MiB) measured on
    the **Arrow in-memory size** of the rows, as pyiceberg's own writer does: compressed Parquet files come out
    several times smaller than the target. ``DataFile`` statistics come from the Parquet footer, exactly as
    pyiceberg computes them for its own writes.
    """
    if table.num_rows == 0:
        return []
    io = io or file_io_for(target)
    props = target.props
    kwargs = _get_parquet_writer_kwargs(props)
    kwargs["use_dictionary"] = dictionary_columns(target.schema)
    row_group_rows = int(props.get(TableProperties.PARQUET_ROW_GROUP_LIMIT,
                                   TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT))
    stats_plan = statistics_plan(target.schema, props)
    id_mapping = parquet_path_to_id_mapping(target.schema)
    locations = load_location_provider(target.location, props)
    target_size = target.target_file_size
    files: list[DataFile] = []
    for key, part in split_by_partition(table, target.schema, target.spec):
        rows_per_file = max(1, int(target_size * part.num_rows / max(part.nbytes, 1)))
        for lo in range(0, part.num_rows, rows_per_file):
            piece = part.slice(lo, rows_per_file)
            path = locations.new_data_location(data_file_name(partition, start_offset, prefix), key)
            with io.new_output(path).create(overwrite=True) as stream:
                writer = pq.ParquetWriter(stream, schema=piece.schema, store_decimal_as_integer=True, **kwargs)
                writer.write_table(piece, row_group_size=row_group_rows)
                writer.close()
                size = stream.tell()
            if not isinstance(io, DurableFileIO):  # a durable FileIO already synced it on close
                local = local_path(path)
                if local is not None:
                    fsync_file(local)  # durable before any commit can reference it (power loss too)
            stats = data_file_statistics_from_parquet_metadata(writer.writer.metadata, stats_plan, id_mapping)
            data_file = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=path,
                file_format=FileFormat.PARQUET,
                partition=key.partition if key is not None else Record(),
                file_size_in_bytes=size,
                sort_order_id=None,
                spec_id=target.spec.spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
            set_file_spec_id(data_file, target.spec.spec_id)  # from_args drops it
            files.append(data_file)
    return files


def remove_files(paths: list[str], target: WriteTarget) -> int:
    """Delete files of ``target`` that were never committed; missing ones are fine. Returns how many were deleted."""
    io = file_io_for(target)
    n = 0
    for p in paths:
        try:
            io.delete(p)
            n += 1
        except FileNotFoundError:
            pass
    return n


# ------------------------------------------------------------------------------------------------ the writer seam


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """What a writer wrote for one chunk, ready to commit."""

    data_files: tuple[DataFile, ...] = ()
    delete_files: tuple[DeleteFile, ...] = ()  # a writer's own delete files: the coordinator refuses them
    change_files: tuple[DataFile, ...] = ()  # the merge writer's: → TaskResult / CommitResponse.change_files


class FileWriter(Protocol):
    """Writes a chunk's converted rows as files of ``target``'s table (:class:`AppendWriter`, :class:`ChangeWriter`)."""

    def write(self, rows: pa.Table, target: WriteTarget, *, partition: int, start_offset: int) -> WrittenFiles:
        """``rows`` are in ``schema_to_pyarrow(target.schema, include_field_ids=True)``; ``start_offset`` (the first
        Kafka offset of the chunk) goes into the file names."""
        ...


class AppendWriter:
    """Every row is a new row: data files only (:func:`write_data_files`)."""

    def write(self, rows: pa.Table, target: WriteTarget, *, partition: int, start_offset: int) -> WrittenFiles:
        return WrittenFiles(tuple(write_data_files(rows, target, partition=partition, start_offset=start_offset)))


def write_change_file(rows: pa.Table, target: WriteTarget, *, partition: int, start_offset: int,
                      io: FileIO | None = None) -> DataFile:
    """Write ``rows`` (the table's columns plus the change columns) as one unpartitioned change file under the
    table's data location (``CHANGE_FILE_PREFIX`` name); its entry carries path, size and row count only."""
    io = io or file_io_for(target)
    props = target.props
    path = load_location_provider(target.location, props).new_data_location(
        data_file_name(partition, start_offset, CHANGE_FILE_PREFIX))
    with io.new_output(path).create(overwrite=True) as stream:
        writer = pq.ParquetWriter(stream, schema=rows.schema, store_decimal_as_integer=True,
                                  **_get_parquet_writer_kwargs(props))
        writer.write_table(rows)
        writer.close()
        size = stream.tell()
    # not fsynced: nothing ever commits a change file; after a crash the round is written again
    return DataFile.from_args(content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
                              partition=Record(), record_count=rows.num_rows, file_size_in_bytes=size)


class ChangeWriter:
    """An upsert/CDC table's rows as one change file per chunk (:func:`write_change_file`; none when empty)."""

    def write(self, rows: pa.Table, target: WriteTarget, *, partition: int, start_offset: int) -> WrittenFiles:
        if rows.num_rows == 0:
            return WrittenFiles()
        return WrittenFiles(change_files=(write_change_file(rows, target, partition=partition,
                                                            start_offset=start_offset),))


_WRITERS: dict[str, FileWriter] = {APPEND: AppendWriter(), MERGE: ChangeWriter()}


def writer_for(target: WriteTarget) -> FileWriter:
    """The writer ``target`` names (KeyError for an unknown one)."""
    return _WRITERS[target.writer]


def writer_name(cfg: TableTopicConfig) -> str:
    """The writer a table topic's settings call for: ``merge`` with ``upsert.enable`` / ``cdc.field``
    (``cfg.delta_write``), else ``append``."""
    return MERGE if cfg.delta_write else APPEND
