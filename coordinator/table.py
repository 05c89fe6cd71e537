"""A table topic's Iceberg table, read side: its name, the offsets stored in it, its files, its columns.

Every write to the catalog is in :mod:`coordinator.committer`; this module only reads. It owns the broker's
bookkeeping in the table, ``tabletopic.*`` table properties set in the same transaction as each round's rows, so
exactly as durable and atomic as the data (what each holds: the constants below; for readers: docs/querying.md,
"What the broker keeps in a table"): the committed offsets (:func:`committed_offsets`, :func:`commit_landed`), the
dead letters a round named (:func:`pending_dead_letters`; the dead-letter table, :func:`dead_letter_identifier`),
the ``partition.by`` applied (:func:`partition_by_problem`) and whether rows were appended (:func:`appends_conflict`).

Rule: the state that decides exactly once lives in table properties, never only in snapshot summaries, which carry
``tabletopic.commit-id`` and ``tabletopic.watermark`` too (for humans, and to resolve an unknown commit outcome) but
do not survive Spark compaction followed by snapshot expiry. Blocking catalog and file I/O throughout: call from a
worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import PrimitiveType

from configs.table_schema import (
    HEADER,
    KEY,
    METADATA,
    VALUE,
    cdc_field_problem,
    column_list,
    id_columns_problem,
    table_schema,
)
from configs.table_topic import FORMAT_VERSION, TableTopicConfig, TransformType
from coordinator.contract import DATA_DIR, DATA_FILE_PREFIX, DEAD_LETTER_SUFFIX, WorkerFile, parse_data_file_name
from coordinator.listing import list_files, path_key

OFFSETS_PROPERTY = "tabletopic.offsets"
"""JSON ``{"<partition>": <next offset>}``: the first offset of each partition that is *not* in the table."""
COMMIT_ID_PROPERTY = "tabletopic.commit-id"
"""The commit id of the round that last changed the offsets (on a dead-letter table: whose dead letters it took)."""
# the id of the topic the offsets belong to: a topic deleted and created again under the same name (the table is
# kept) is another incarnation whose offsets restart at 0, so the old offsets must not apply to it
TOPIC_ID_PROPERTY = "tabletopic.topic-id"
SUMMARY_COMMIT_ID = "tabletopic.commit-id"
SUMMARY_WATERMARK = "tabletopic.watermark"
PARTITION_BY_PROPERTY = "tabletopic.partition-by"
"""The ``partition.by`` last applied to the spec (:func:`coordinator.committer.evolve_partition_spec`)."""
PARTITION_BY_PROBLEM_PROPERTY = "tabletopic.partition-by.problem"
"""Why the current ``partition.by`` is not applied, while it is not (a value stored before the config checks refused
it), for ``tabletopic tables`` and anyone reading the table."""
# set by every round that appended rows (an append table's round; never an upsert/CDC round's merge): a key may
# have several rows in the table, so upserts cannot be turned on for it (appends_conflict)
APPENDED_PROPERTY = "tabletopic.rows-appended"
DEAD_LETTERS_OF_PROPERTY = "tabletopic.dead-letters-of"  # on a dead-letter table: the main table's dotted name
PENDING_DEAD_LETTERS_PROPERTY = "tabletopic.dead-letters.pending"
"""On the main table: the round's dead-letter files and offsets (:class:`PendingDeadLetters`), which the committer
then adds to the dead-letter table once (its ``tabletopic.commit-id`` then names that round, its
``tabletopic.offsets`` say up to where the dead letters are in it)."""

DEFAULT_NAMESPACE = "default"
"""Used when ``automq.table.topic.namespace`` is blank: pyiceberg catalogs refuse namespace-less tables."""


def catalog_identifier(topic: str, cfg: TableTopicConfig) -> tuple[str, ...]:
    """The identifier the topic's table has in the catalog: ``cfg.table_identifier(topic)`` (the configured name),
    with :data:`DEFAULT_NAMESPACE` when the namespace is blank."""
    ident = cfg.table_identifier(topic)
    return ident if len(ident) > 1 else (DEFAULT_NAMESPACE, *ident)


def catalog_tables(catalog: Catalog) -> Iterator[tuple[str, ...]]:
    """Every table identifier of ``catalog``, in every namespace, nested ones included (pyiceberg lists one level
    of namespaces at a time)."""
    pending = sorted(catalog.list_namespaces(), reverse=True)
    seen: set[tuple[str, ...]] = set()
    while pending:
        namespace = pending.pop()
        if namespace in seen:
            continue
        seen.add(namespace)
        yield from sorted(catalog.list_tables(namespace))
        pending.extend(sorted((n for n in catalog.list_namespaces(namespace) if n not in seen), reverse=True))


def dead_letter_identifier(table: tuple[str, ...]) -> tuple[str, ...]:
    """The dead-letter table of the table ``table``: ``<namespace>.<table>_dlq``."""
    return (*table[:-1], table[-1] + DEAD_LETTER_SUFFIX)


def dead_letters_of(tbl: Table) -> str | None:
    """The dotted name of the table whose dead letters ``tbl`` holds (None: ``tbl`` is no dead-letter table)."""
    return tbl.properties.get(DEAD_LETTERS_OF_PROPERTY)


@dataclass(frozen=True, slots=True)
class PendingDeadLetters:
    """The dead letters of the main table's round ``commit_id``: its dead-letter files and new offsets."""

    commit_id: str
    offsets: dict[int, int]
    files: tuple[str, ...]

    def encode(self) -> str:
        return json.dumps({"commit-id": self.commit_id, "offsets": {str(p): o for p, o in self.offsets.items()},
                           "files": list(self.files)}, separators=(",", ":"))


def pending_dead_letters(tbl: Table) -> PendingDeadLetters | None:
    """The dead letters the main table's last round with dead letters named (they may be in the dead-letter
    table already: compare its commit id); raises ValueError when the property is not what we write."""
    raw = tbl.properties.get(PENDING_DEAD_LETTERS_PROPERTY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return PendingDeadLetters(str(doc["commit-id"]), {int(p): int(o) for p, o in doc["offsets"].items()},
                                  tuple(str(f) for f in doc["files"]))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"table {'.'.join(tbl.name())} has a malformed {PENDING_DEAD_LETTERS_PROPERTY}: "
                         f"{e!r}") from None


def partition_by_problem(tbl: Table) -> str | None:
    """Why the table's spec does not follow the topic's ``partition.by`` (None: it does)."""
    return tbl.properties.get(PARTITION_BY_PROBLEM_PROPERTY)


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
    ident = catalog_identifier(topic, cfg)
    name = ".".join(ident)
    if not catalog.table_exists(ident):
        return name, []
    have = {f.name: f.field_type for f in catalog.load_table(ident).schema().fields}
    out: list[ColumnConflict] = []
    for column, convert in ((KEY, cfg.convert_key_type), (VALUE, cfg.convert_value_type)):
        if convert.columns_from_records and isinstance(have.get(column), PrimitiveType):
            out.append(ColumnConflict(column, str(have[column]), "a struct of the records' fields"))
    for f in table_schema(cfg).fields:
        if not isinstance(f.field_type, PrimitiveType):
            continue
        if f.name not in have:
            out.append(ColumnConflict(f.name, None, str(f.field_type)))
        elif have[f.name] != f.field_type:
            out.append(ColumnConflict(f.name, str(have[f.name]), str(f.field_type)))
    return name, out


def _schema_problem(catalog: Catalog, topic: str, cfg: TableTopicConfig,
                    problem_of: Callable[[Schema, TableTopicConfig], str | None]) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and ``problem_of`` its schema (None when the table does not
    exist), with the table's columns."""
    ident = catalog_identifier(topic, cfg)
    name = ".".join(ident)
    if not catalog.table_exists(ident):
        return name, None
    schema = catalog.load_table(ident).schema()
    problem = problem_of(schema, cfg)
    return name, None if problem is None else f"{problem}; its columns are {column_list(schema)}"


def id_columns_conflict(catalog: Catalog, topic: str, cfg: TableTopicConfig) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and why its ``id.columns`` cannot key it (None: they can, the
    columns have not come yet, or the table does not exist; :func:`configs.table_schema.id_columns_problem`)."""
    if not cfg.id_columns:
        return ".".join(catalog_identifier(topic, cfg)), None
    return _schema_problem(catalog, topic, cfg, id_columns_problem)


def cdc_field_conflict(catalog: Catalog, topic: str, cfg: TableTopicConfig) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and why its ``cdc.field`` cannot hold an op (None: it can, its
    column has not come yet, or the table does not exist; :func:`configs.table_schema.cdc_field_problem`)."""
    if cfg.cdc_field is None:
        return ".".join(catalog_identifier(topic, cfg)), None
    return _schema_problem(catalog, topic, cfg, cdc_field_problem)


def format_version_conflict(catalog: Catalog, topic: str, cfg: TableTopicConfig) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and why the ``format-version`` its auto-create properties give does
    not hold for it (None: they give none, the table does not exist or is of that version): the properties apply
    when the broker creates the table, so a table of another version would silently stay as it is."""
    ident = catalog_identifier(topic, cfg)
    name = ".".join(ident)
    asked = dict(cfg.iceberg_auto_create_properties).get(FORMAT_VERSION)
    if asked is None or not catalog.table_exists(ident):
        return name, None
    have = catalog.load_table(ident).metadata.format_version
    if str(have) == asked:
        return name, None
    change = (f"upgrade it (`tabletopic sql \"ALTER TABLE {name} SET TBLPROPERTIES ('{FORMAT_VERSION}'='{asked}')\"`) "
              f"or drop it" if int(asked) > have else "a format version never goes down: drop the table")
    return name, (f"it is format version {have}, not {asked} (auto-create properties apply when the broker creates "
                  f"the table): {change} (with enable=false; turning it on again creates it), or leave "
                  f"{FORMAT_VERSION} out")


CDC_COLUMN = "_cdc"  # flatten_debezium's column beside the row's (worker.transforms.debezium.CDC)
LEGACY_COLUMNS = ("key", "value", "timestamp")  # schema.type=schemaless
_LAYOUTS = {
    "legacy": "in the legacy key, value and timestamp columns (schema.type=schemaless)",
    TransformType.NONE: f"in its {VALUE} column",
    TransformType.FLATTEN: "flattened into top-level columns",
    TransformType.FLATTEN_DEBEZIUM: f"Debezium rows in top-level columns beside {CDC_COLUMN}",
}


def _value_layout(cfg: TableTopicConfig) -> str:
    return "legacy" if cfg.legacy_columns else str(cfg.transform_value_type)


def _table_layout(columns: set[str]) -> str | None:
    """How a table holds the record values, by its columns (None: no value column yet, as before the first records
    of a JSON or schema-registry converter)."""
    if VALUE in columns:
        return TransformType.NONE
    if set(LEGACY_COLUMNS) <= columns:
        return "legacy"
    if CDC_COLUMN in columns:
        return TransformType.FLATTEN_DEBEZIUM
    return TransformType.FLATTEN if columns - {HEADER, KEY, METADATA} else None


def value_layout_conflict(catalog: Catalog, topic: str, cfg: TableTopicConfig, before: TableTopicConfig | None
                          ) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and why it cannot take ``cfg``'s value transform (None: the
    transform is ``before``'s, the table does not exist or has no value column yet, or holds its values the way
    ``cfg`` would): ``none`` keeps a value in ``_kafka_value``, ``flatten`` and ``flatten_debezium`` in top-level
    columns (beside ``_cdc``), and the new layout's columns would be added beside the old ones."""
    ident = catalog_identifier(topic, cfg)
    name = ".".join(ident)
    want = _value_layout(cfg)
    if (before is not None and _value_layout(before) == want) or not catalog.table_exists(ident):
        return name, None
    columns = [f.name for f in catalog.load_table(ident).schema().fields]
    have = _table_layout(set(columns))
    if have is None or have == want:
        return name, None
    shown = [c for c in columns if c not in (HEADER, KEY, METADATA)]
    listed = ", ".join(shown[:4]) + (", ..." if len(shown) > 4 else "")
    return name, (f"its values are {_LAYOUTS[have]} ({listed}); with {want} they would be {_LAYOUTS[want]}, beside "
                  f"those: the broker does not change an existing table's column layout. Create a new topic, or drop "
                  f"the table (with enable=false; turning it on again creates it anew from the topic's log start)")


def _records(tbl: Table) -> int:
    """The rows of the table's current snapshot (its summary's ``total-records``; 1 when it does not say)."""
    snapshot = tbl.current_snapshot()
    if snapshot is None:
        return 0
    summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    return int(summary.get("total-records", 1))


def appends_conflict(catalog: Catalog, topic: str, cfg: TableTopicConfig, before: TableTopicConfig | None
                     ) -> tuple[str, str | None]:
    """The table ``cfg`` writes to (dotted name) and why upserts or CDC cannot be turned on for it (None: ``cfg``
    has neither, ``before`` had them already, or the table does not exist or is empty): it holds rows written as
    appends, so a key may have several rows, and the broker does not rewrite a table to one row per key. A topic
    created over an existing table (``before`` None) is refused only when a round appended rows to it
    (:data:`APPENDED_PROPERTY`): the table of a deleted upsert topic takes upserts again. Turning upserts off is
    never refused: the table becomes an append table."""
    ident = catalog_identifier(topic, cfg)
    name = ".".join(ident)
    if not cfg.delta_write or (before is not None and before.delta_write) or not catalog.table_exists(ident):
        return name, None
    tbl = catalog.load_table(ident)
    records = _records(tbl)
    if records == 0 or (before is None and tbl.properties.get(APPENDED_PROPERTY) != "true"):
        return name, None
    rows = f"{records} row{'s' if records != 1 else ''}"
    return name, (f"it holds {rows} written as appends: a key may have several, which upserts would keep for good "
                  f"(the broker does not rewrite a table to one row per key). Use a new topic, or set enable=false, "
                  f"drop the table and turn it on again with upserts (it is created anew from the topic's log start)")


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


def list_worker_files(tbl: Table, prefix: str = DATA_FILE_PREFIX, location: str | None = None
                      ) -> list[WorkerFile] | None:
    """Worker-named files (``prefix``) under the ``data/`` folder of ``tbl``'s location (or of ``location``: the
    dead-letter table's, which may not exist yet), listed through ``tbl``'s FileIO, locations spelled as the table's
    metadata spells them (:func:`coordinator.listing.list_files`); None when the FileIO cannot list. Raises OSError
    when the store cannot be read."""
    listed = list_files(tbl.io, f"{(location or tbl.location()).rstrip('/')}/{DATA_DIR}")
    if listed is None:
        return None
    return [WorkerFile(f.location, wf.partition, wf.start_offset) for f in listed
            if (wf := parse_data_file_name(f.relative, prefix)) is not None]


def same_path(a: str, b: str) -> bool:
    """Compare file locations that may differ only by spelling (``file:/x`` vs ``file:///x``, ``s3a://`` vs
    ``s3://``: :func:`coordinator.listing.path_key`)."""
    return path_key(a) == path_key(b)
