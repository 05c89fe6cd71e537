"""A table topic's Iceberg table: creation, partition-spec evolution, and the offsets stored in it.

The committed Kafka offsets live **in the table**, as table properties set in the same transaction as each
append (see :mod:`coordinator.committer`), so they are exactly as durable and as atomic as the data:

- ``tabletopic.offsets``: JSON ``{"<partition>": <next offset>}`` — the first offset of each partition that is
  *not* in the table;
- ``tabletopic.commit-id``: the commit id of the round that last changed them.

``tabletopic.partition-by`` records the ``partition.by`` last applied to the spec (see
:func:`evolve_partition_spec`); ``tabletopic.partition-by.problem`` says why the current ``partition.by`` is not
applied, while it is not (a value stored before the config checks refused it), for ``tabletopic tables`` and
anyone reading the table.

Snapshot summaries carry ``tabletopic.commit-id`` and ``tabletopic.watermark`` too (AutoMQ style, for humans
and for resolving an unknown commit outcome while the snapshot is still in the metadata), but unlike table
properties they do not survive Spark compaction followed by snapshot expiry.

Blocking catalog and file I/O throughout: the coordinator calls these from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import PrimitiveType

from configs.table_schema import partition_by_text as canonical_partition_by
from configs.table_schema import partition_spec, table_schema
from configs.table_topic import TableTopicConfig
from tabletopic.errors import InvalidConfigError

log = logging.getLogger(__name__)

OFFSETS_PROPERTY = "tabletopic.offsets"
COMMIT_ID_PROPERTY = "tabletopic.commit-id"
# the id of the topic the offsets belong to: a topic deleted and created again under the same name (the table is
# kept) is another incarnation whose offsets restart at 0, so the old offsets must not apply to it
TOPIC_ID_PROPERTY = "tabletopic.topic-id"
SUMMARY_COMMIT_ID = "tabletopic.commit-id"
SUMMARY_WATERMARK = "tabletopic.watermark"
PARTITION_BY_PROPERTY = "tabletopic.partition-by"
PARTITION_BY_PROBLEM_PROPERTY = "tabletopic.partition-by.problem"

DEFAULT_NAMESPACE = "default"
"""Used when ``automq.table.topic.namespace`` is blank: pyiceberg catalogs refuse namespace-less tables."""

# The workers' data file naming: tt-p<partition>-<start offset>-<uuid>.parquet
DATA_FILE_NAME = re.compile(r"^tt-p(\d+)-(\d+)-[0-9A-Za-z-]+\.parquet$")


def table_identifier(topic: str, cfg: TableTopicConfig) -> tuple[str, ...]:
    """``cfg.table_identifier(topic)``, with :data:`DEFAULT_NAMESPACE` when the namespace is blank."""
    ident = cfg.table_identifier(topic)
    return ident if len(ident) > 1 else (DEFAULT_NAMESPACE, *ident)


def _desired_spec(schema: Schema, cfg: TableTopicConfig) -> PartitionSpec | str:
    """The spec ``partition.by`` asks for over ``schema``, or why it does not apply to it."""
    try:
        return partition_spec(schema, cfg.partition_by)
    except InvalidConfigError as e:
        return f"not applied: {e}"


def partition_by_problem(tbl: Table) -> str | None:
    """Why the table's spec does not follow the topic's ``partition.by`` (None: it does)."""
    return tbl.properties.get(PARTITION_BY_PROBLEM_PROPERTY)


def _record_problem(tbl: Table, problem: str | None) -> Table:
    """Set (or clear, with None) :data:`PARTITION_BY_PROBLEM_PROPERTY`; a no-op when it already says that."""
    if partition_by_problem(tbl) == problem:
        return tbl
    txn = tbl.transaction()
    if problem is None:
        txn.remove_properties(PARTITION_BY_PROBLEM_PROPERTY)
    else:
        log.error("table %s: %s; keeping the current partitioning", ".".join(tbl.name()), problem)
        txn.set_properties({PARTITION_BY_PROBLEM_PROPERTY: problem})
    return txn.commit_transaction()


def load_or_create_table(catalog: Catalog, topic: str, cfg: TableTopicConfig) -> Table:
    """Load the topic's table, creating namespace and table (format v2, schema and spec from ``cfg``) if needed.

    A table another process created first (TableAlreadyExistsError) is loaded instead.
    """
    ident = table_identifier(topic, cfg)
    if catalog.table_exists(ident):
        return catalog.load_table(ident)
    namespace = ident[:-1]
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    desired = _desired_spec(table_schema(cfg), cfg)
    properties = {**dict(cfg.iceberg_auto_create_properties), "format-version": "2"}
    if isinstance(desired, str):
        log.error("table %s: %s; creating it unpartitioned", ".".join(ident), desired)
        spec = UNPARTITIONED_PARTITION_SPEC
        properties[PARTITION_BY_PROBLEM_PROPERTY] = desired
    else:
        spec = desired
        properties[PARTITION_BY_PROPERTY] = partition_by_text(cfg)
    try:
        tbl = catalog.create_table(ident, schema=table_schema(cfg), partition_spec=spec, properties=properties)
    except TableAlreadyExistsError:
        return catalog.load_table(ident)
    log.info("created table %s for topic %s (spec %s)", ".".join(ident), topic, tbl.spec())
    return tbl


@dataclass(frozen=True, slots=True)
class ColumnConflict:
    """A column the converters need with another type than the existing table has (``have`` None: missing)."""

    column: str
    have: str | None
    want: str


def converter_conflicts(catalog: Catalog, topic: str, cfg: TableTopicConfig) -> tuple[str, list[ColumnConflict]]:
    """The table ``cfg`` writes to (dotted name) and its columns that do not match what ``cfg``'s converters
    produce (``_kafka_key``/``_kafka_value``, or the legacy ``key``/``value``/``timestamp``); no conflicts when the
    table does not exist. The fixed ``_kafka_header``/``_kafka_metadata`` columns are the same for every setting.
    """
    ident = table_identifier(topic, cfg)
    name = ".".join(ident)
    if not catalog.table_exists(ident):
        return name, []
    have = {f.name: f.field_type for f in catalog.load_table(ident).schema().fields}
    out: list[ColumnConflict] = []
    for f in table_schema(cfg).fields:
        if not isinstance(f.field_type, PrimitiveType):
            continue
        if f.name not in have:
            out.append(ColumnConflict(f.name, None, str(f.field_type)))
        elif have[f.name] != f.field_type:
            out.append(ColumnConflict(f.name, str(have[f.name]), str(f.field_type)))
    return name, out


def _spec_key(spec: PartitionSpec) -> set[tuple[int, str, str]]:
    return {(f.source_id, str(f.transform), f.name) for f in spec.fields}


def partition_by_text(cfg: TableTopicConfig) -> str:
    """``partition.by`` in canonical form, as recorded in :data:`PARTITION_BY_PROPERTY`."""
    return canonical_partition_by(cfg.partition_by)


def evolve_partition_spec(tbl: Table, cfg: TableTopicConfig) -> Table:
    """Make the table's default spec match ``partition.by`` (add/remove fields); returns the current table.

    Only a *changed* ``partition.by`` is applied: the value last applied is recorded in the table
    (:data:`PARTITION_BY_PROPERTY`, same transaction as the spec change), so a spec someone evolved by hand
    (Spark ``ALTER TABLE``) is not reverted on every round or restart. Removals and additions go in one
    transaction, removals first, so that a changed transform keeping its field name (``bucket(k, 16)`` →
    ``bucket(k, 32)``, both ``k_bucket``) does not clash.

    A ``partition.by`` that does not fit the table (stored before the config checks refused it) leaves the spec as
    it is and is recorded in :data:`PARTITION_BY_PROBLEM_PROPERTY` (logged once, when it changes); the property
    goes away once a ``partition.by`` applies again.
    """
    text = partition_by_text(cfg)
    if tbl.properties.get(PARTITION_BY_PROPERTY) == text:
        return _record_problem(tbl, None)
    desired = _desired_spec(tbl.schema(), cfg)
    if isinstance(desired, str):
        return _record_problem(tbl, desired)
    want = _spec_key(desired)
    have = _spec_key(tbl.spec())
    if want == have:
        return _record_problem(tbl, None)
    schema = tbl.schema()
    removed = [f for f in tbl.spec().fields if (f.source_id, str(f.transform), f.name) not in want]
    added = [f for f in desired.fields if (f.source_id, str(f.transform), f.name) not in have]
    txn = tbl.transaction()
    if removed:
        with txn.update_spec() as upd:
            for f in removed:
                upd.remove_field(f.name)
    if added:
        with txn.update_spec() as upd:
            for f in added:
                column = schema.find_column_name(f.source_id)
                assert column is not None
                upd.add_field(column, f.transform, f.name)
    txn.set_properties({PARTITION_BY_PROPERTY: text})
    if partition_by_problem(tbl) is not None:
        txn.remove_properties(PARTITION_BY_PROBLEM_PROPERTY)
    tbl = txn.commit_transaction()
    log.info("evolved the partition spec of %s to %s (spec id %d) for partition.by=%s", ".".join(tbl.name()),
             tbl.spec(), tbl.spec().spec_id, text)
    return tbl


def committed_offsets(tbl: Table) -> dict[int, int]:
    """The table's committed offsets (partition → next offset); partitions never committed are absent.

    Raises ValueError when the property is not what we write: guessing would risk duplicates or loss.
    """
    raw = tbl.properties.get(OFFSETS_PROPERTY)
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise TypeError("not an object")
        return {int(p): int(o) for p, o in doc.items()}
    except (ValueError, TypeError) as e:
        raise ValueError(f"table {'.'.join(tbl.name())} has a malformed {OFFSETS_PROPERTY}={raw!r}: {e}") from None


def encode_offsets(offsets: dict[int, int]) -> str:
    return json.dumps({str(p): o for p, o in sorted(offsets.items())}, separators=(",", ":"))


def snapshot_of_commit(tbl: Table, commit_id: str) -> Snapshot | None:
    """The snapshot still in the table's metadata whose summary carries ``commit_id``."""
    for snap in tbl.snapshots():
        if snap.summary is not None and snap.summary.get(SUMMARY_COMMIT_ID) == commit_id:
            return snap
    return None


def commit_landed(tbl: Table, commit_id: str) -> bool:
    """True when the round ``commit_id`` is in the table.

    Either it is still the last round to change the offsets (``tabletopic.commit-id``: checked first because
    it survives maintenance), or a snapshot still in the metadata names it (when a later round committed on
    top). ``tbl`` must be freshly loaded.
    """
    return tbl.properties.get(COMMIT_ID_PROPERTY) == commit_id or snapshot_of_commit(tbl, commit_id) is not None


def files_added_by(tbl: Table, snap: Snapshot) -> set[str]:
    """Paths of the data files ``snap`` added (reads its manifests)."""
    out: set[str] = set()
    for manifest in snap.manifests(tbl.io):
        if manifest.added_snapshot_id != snap.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=True):
            if entry.snapshot_id == snap.snapshot_id:
                out.add(entry.data_file.file_path)
    return out


def referenced_files(tbl: Table) -> set[str]:
    """Paths of every data/delete file referenced by any snapshot still in the metadata (reads manifests)."""
    out: set[str] = set()
    seen: set[str] = set()
    for snap in tbl.snapshots():
        for manifest in snap.manifests(tbl.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=True):
                out.add(entry.data_file.file_path)
    return out


@dataclass(frozen=True, slots=True)
class WorkerFile:
    path: str
    partition: int
    start_offset: int


def parse_worker_file(path: str) -> WorkerFile | None:
    """Partition and start offset from a worker file's name, None for other files."""
    m = DATA_FILE_NAME.match(path.rsplit("/", 1)[-1])
    if m is None:
        return None
    return WorkerFile(path, int(m.group(1)), int(m.group(2)))


def list_worker_files(tbl: Table) -> list[WorkerFile] | None:
    """Worker-named files under the table's ``data/`` directory; None when its location is not ``file://``.

    Listing is only implemented for local warehouses: object stores would need a paginated listing per
    FileIO, which pyiceberg does not offer.
    """
    parts = urlsplit(tbl.location())
    if parts.scheme not in ("file", ""):
        return None
    root = os.path.join(unquote(parts.path), "data")
    out: list[WorkerFile] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            wf = parse_worker_file(name)
            if wf is not None:
                path = os.path.join(dirpath, name)
                out.append(WorkerFile(f"file://{path}" if parts.scheme == "file" else path,
                                      wf.partition, wf.start_offset))
    return out


def same_path(a: str, b: str) -> bool:
    """Compare file locations that may differ only by ``file:`` spelling (``file:/x`` vs ``file:///x``)."""
    return _norm(a) == _norm(b)


def _norm(p: str) -> str:
    parts = urlsplit(p)
    if parts.scheme in ("file", ""):
        return os.path.normpath(unquote(parts.path))
    return p
