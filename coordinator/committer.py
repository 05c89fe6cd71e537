"""Every write to a table topic's Iceberg tables: creation, partition-spec evolution and the round's commits.

The rest of the coordinator only reads the tables (:mod:`coordinator.table`). Table creation
(:func:`load_or_create_table`, :func:`load_or_create_dead_letter_table`) and :func:`evolve_partition_spec` are
small transactions of their own. :func:`commit_round` commits a round exactly once as one transaction, all or
nothing: its data files (or its staged merge published), the ``tabletopic.offsets`` / ``tabletopic.commit-id``
properties, its pending dead letters and the snapshot expiry; :func:`commit_dead_letters` then adds those dead
letters to the dead-letter table, once; :func:`resolve_round` decides a round whose outcome was unknown. A format v3
table gets the same writes as a :class:`~coordinator.table_writer.TableUpdate` through the injected table engine
(:class:`coordinator.engine.TableEngine`).

Rules: a clean conflict (``CommitFailedException``, ``ValidationException``: nothing landed) is retried only after
checking again that the table's offsets are the round's base; any other failure is resolved by reading the table
back, never retried blindly; a file a snapshot references is never deleted; pyiceberg's own commit retry stays off
for these transactions. Blocking I/O: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    TableAlreadyExistsError,
    ValidationException,
)
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update.snapshot import ExpireSnapshots, ManageSnapshots
from pyiceberg.transforms import parse_transform

from configs.errors import InvalidConfigError
from configs.table_schema import partition_by_text as canonical_partition_by
from configs.table_schema import partition_spec, table_schema
from configs.table_topic import FORMAT_VERSION, RESERVED_PREFIX, TableTopicConfig
from coordinator import metadata_copies  # noqa: F401 (commits cost what a table's snapshots cost to copy)
from coordinator.contract import (
    DEAD_LETTER_SCHEMA,
    LEGACY_DEAD_LETTER_FIELD_IDS,
    DataFile,
    dead_letter_location,
    file_spec_id,
)
from coordinator.engine import TableEngine
from coordinator.merge import MERGE_TABLE_PROPERTIES, StagedMerge
from coordinator.table import (
    APPENDED_PROPERTY,
    COMMIT_ID_PROPERTY,
    DEAD_LETTERS_OF_PROPERTY,
    OFFSETS_PROPERTY,
    PARTITION_BY_PROBLEM_PROPERTY,
    PARTITION_BY_PROPERTY,
    PENDING_DEAD_LETTERS_PROPERTY,
    SUMMARY_COMMIT_ID,
    SUMMARY_WATERMARK,
    TOPIC_ID_PROPERTY,
    PendingDeadLetters,
    catalog_identifier,
    commit_landed,
    committed_offsets,
    dead_letter_identifier,
    dead_letters_of,
    encode_offsets,
    partition_by_problem,
    pending_dead_letters,
    referenced_files,
    same_path,
)
from coordinator.table_writer import (
    WRITER_FORMAT_VERSION,
    AddedFile,
    TableUpdate,
    WriterMissingError,
    commit_update,
    written_by_writer,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 3


# ------------------------------------------------------------------------------------------------ the table itself

def _desired_spec(schema: Schema, cfg: TableTopicConfig) -> PartitionSpec | str:
    """The spec ``partition.by`` asks for over ``schema``, or why it does not apply to it."""
    try:
        return partition_spec(schema, cfg.partition_by)
    except InvalidConfigError as e:
        return f"not applied: {e}"


def apply_update(tbl: Table, update: TableUpdate, engine: TableEngine | None = None) -> Table:
    """Commit ``update``'s properties and partition-spec changes on ``tbl`` (pyiceberg; a format v3 table through
    ``engine``, :mod:`coordinator.table_writer`); returns the current table."""
    if written_by_writer(tbl):
        return commit_update(tbl, update, engine)
    txn = tbl.transaction()
    if update.set_properties:
        txn.set_properties(dict(update.set_properties))
    if update.remove_properties:
        txn.remove_properties(*update.remove_properties)
    # removals first, in their own update: a changed transform may keep its field name (k_bucket)
    if update.remove_spec_fields:
        with txn.update_spec() as upd:
            for name in update.remove_spec_fields:
                upd.remove_field(name)
    if update.add_spec_fields:
        with txn.update_spec() as upd:
            for column, transform, name in update.add_spec_fields:
                upd.add_field(column, parse_transform(transform), name)
    return txn.commit_transaction()


def _record_problem(tbl: Table, problem: str | None, engine: TableEngine | None = None) -> Table:
    """Set (or clear, with None) :data:`PARTITION_BY_PROBLEM_PROPERTY`; a no-op when it already says that."""
    if partition_by_problem(tbl) == problem:
        return tbl
    if problem is None:
        return apply_update(tbl, TableUpdate(remove_properties=(PARTITION_BY_PROBLEM_PROPERTY,)), engine)
    log.error("table %s: %s; keeping the current partitioning", ".".join(tbl.name()), problem)
    return apply_update(tbl, TableUpdate(set_properties={PARTITION_BY_PROBLEM_PROPERTY: problem}), engine)


class TableConflictError(Exception):
    """A table of the name a table topic needs is another topic's (a dead-letter table, or a main table where a
    dead-letter table belongs): nothing is written to it."""


def _not_dead_letters(tbl: Table, topic: str) -> Table:
    owner = dead_letters_of(tbl)
    if owner is not None:
        raise TableConflictError(f"table {'.'.join(tbl.name())} holds the dead letters of table {owner}, so topic "
                                 f"{topic} cannot write to it: rename the topic or that table")
    return tbl


def table_properties(cfg: TableTopicConfig) -> dict[str, str]:
    """The properties of a new table for ``cfg``: its ``iceberg.auto-create.properties`` as given (the config checks
    refuse those that would not apply: :mod:`configs.table_topic`), its format version (2 unless they ask for 3),
    an upsert/CDC table's merge properties, and the Parquet codec when they name none.

    The codec is written down because the table's writers disagree on a table without one: pyiceberg (the workers)
    writes zstd, Iceberg's Java writers (the Spark side process's merges, rewriting rounds and compactions) gzip,
    which costs a rewriting round of a 100k-row table ~0.4 s of its ~1.5 s for no smaller file (measured: the files
    are within 2%). zstd is also what Iceberg's Java library itself puts into every table it creates."""
    properties = {k: v for k, v in cfg.iceberg_auto_create_properties if not k.startswith(RESERVED_PREFIX)}
    properties.setdefault(TableProperties.PARQUET_COMPRESSION, TableProperties.PARQUET_COMPRESSION_DEFAULT)
    properties[FORMAT_VERSION] = str(WRITER_FORMAT_VERSION if cfg.format_version >= WRITER_FORMAT_VERSION else 2)
    if cfg.delta_write:
        properties.update(MERGE_TABLE_PROPERTIES)
    return properties


def default_location(catalog: Catalog, ident: tuple[str, ...]) -> str | None:
    """Where ``catalog`` puts a new table ``ident`` through pyiceberg (the namespace's location, else
    ``<warehouse>/<namespace levels joined by dots>/<table>``), given to the format v3 tables the Spark side
    process creates: Iceberg-Java's JDBC catalog would join the levels with slashes and put the tables of namespace
    ``a.b`` inside the location of table ``a.b`` (docs/design-notes.md, "A namespace is one folder below the
    warehouse"). None for catalogs that choose themselves (REST: the same server answers Spark)."""
    resolve = getattr(catalog, "_resolve_table_location", None)  # pyiceberg's metastore catalogs (SQL, Hive, Glue)
    if resolve is None:
        return None
    return str(resolve(None, Catalog.namespace_to_string(ident[:-1]), ident[-1]))


def load_or_create_table(catalog: Catalog, topic: str, cfg: TableTopicConfig, engine: TableEngine | None = None
                         ) -> Table:
    """Load the topic's table, creating namespace and table (schema, spec and :func:`table_properties` from
    ``cfg``) if needed: format v2 by pyiceberg, format v3 through ``engine`` (:mod:`coordinator.table_writer`).

    A table another process created first (TableAlreadyExistsError) is loaded instead; a dead-letter table of that
    name raises :class:`TableConflictError`.
    """
    ident = catalog_identifier(topic, cfg)
    if catalog.table_exists(ident):
        return _not_dead_letters(catalog.load_table(ident), topic)
    namespace = ident[:-1]
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    desired = _desired_spec(table_schema(cfg), cfg)
    properties = table_properties(cfg)
    if isinstance(desired, str):
        log.error("table %s: %s; creating it unpartitioned", ".".join(ident), desired)
        spec = UNPARTITIONED_PARTITION_SPEC
        properties[PARTITION_BY_PROBLEM_PROPERTY] = desired
    else:
        spec = desired
        properties[PARTITION_BY_PROPERTY] = partition_by_text(cfg)
    try:
        if properties[FORMAT_VERSION] == str(WRITER_FORMAT_VERSION):
            if engine is None:
                raise WriterMissingError(f"table {'.'.join(ident)} is to be format v3: it is created and committed "
                                         "through the broker's Spark side process, and none is configured")
            engine.create_table(ident, table_schema(cfg), spec, properties, default_location(catalog, ident))
            tbl = catalog.load_table(ident)
        else:
            tbl = catalog.create_table(ident, schema=table_schema(cfg), partition_spec=spec, properties=properties)
    except TableAlreadyExistsError:
        return _not_dead_letters(catalog.load_table(ident), topic)
    log.info("created table %s for topic %s (format v%d, spec %s)", ".".join(ident), topic,
             tbl.metadata.format_version, tbl.spec())
    return tbl


def prepare_merge_table(tbl: Table, engine: TableEngine | None = None) -> Table:
    """Give an upsert/CDC table the properties its merges need (:data:`MERGE_TABLE_PROPERTIES`) when it lacks
    them (a table created for appends, then switched to upserts), and the workers' Parquet codec when it names
    none (a table created before the broker named it: see :func:`table_properties`); returns the current table."""
    missing = {k: v for k, v in MERGE_TABLE_PROPERTIES.items() if tbl.properties.get(k) != v}
    if TableProperties.PARQUET_COMPRESSION not in tbl.properties:
        missing[TableProperties.PARQUET_COMPRESSION] = TableProperties.PARQUET_COMPRESSION_DEFAULT
    if not missing:
        return tbl
    tbl = apply_update(tbl, TableUpdate(set_properties=missing), engine)
    log.info("table %s: set %s for upserts", ".".join(tbl.name()), missing)
    return tbl


def _ours(tbl: Table, main: Table) -> Table:
    """``tbl`` when it is ``main``'s dead-letter table with the columns the workers write, by one of the two
    layouts of field ids (:data:`DEAD_LETTER_SCHEMA`'s, or the legacy one of older tables); else raises."""
    owner = ".".join(main.name())
    if dead_letters_of(tbl) != owner:
        raise TableConflictError(
            f"table {'.'.join(tbl.name())} is not the dead-letter table of {owner} (its "
            f"{DEAD_LETTERS_OF_PROPERTY} is {dead_letters_of(tbl)!r}): the skipped records of {owner} wait until "
            f"it is renamed or dropped")
    fields = {f.name: f for f in tbl.schema().fields}
    for f in DEAD_LETTER_SCHEMA.fields:
        have = fields.get(f.name)
        if have is None or str(have.field_type) != str(f.field_type):
            raise TableConflictError(f"dead-letter table {'.'.join(tbl.name())}: column {f.name} of type "
                                     f"{f.field_type} is missing or has another type; drop the table (it is "
                                     f"created again) or restore the column")
    ids = {name: f.field_id for name, f in fields.items()}
    if not any(all(ids.get(f.name) == layout[f.name] for f in DEAD_LETTER_SCHEMA.fields) for layout in
               ({f.name: f.field_id for f in DEAD_LETTER_SCHEMA.fields}, LEGACY_DEAD_LETTER_FIELD_IDS)):
        raise TableConflictError(f"dead-letter table {'.'.join(tbl.name())}: its columns have field ids "
                                 f"{ids}, not those the workers write; drop the table (it is created again)")
    return tbl


def load_dead_letter_table(catalog: Catalog, main: Table) -> Table | None:
    """``main``'s dead-letter table, None when it does not exist; TableConflictError when the name is taken."""
    ident = dead_letter_identifier(main.name())
    if not catalog.table_exists(ident):
        return None
    return _ours(catalog.load_table(ident), main)


def load_or_create_dead_letter_table(catalog: Catalog, main: Table, cfg: TableTopicConfig) -> Table:
    """``main``'s dead-letter table ``<table>_dlq``, created at :func:`coordinator.contract.dead_letter_location`
    (where the workers write before it exists) with ``DEAD_LETTER_SCHEMA``, unpartitioned, when missing."""
    found = load_dead_letter_table(catalog, main)
    if found is not None:
        return found
    ident = dead_letter_identifier(main.name())
    # format v2 whatever the main table's (it holds no deletes, and pyiceberg commits it)
    properties = {**{k: v for k, v in cfg.iceberg_auto_create_properties if not k.startswith(RESERVED_PREFIX)},
                  FORMAT_VERSION: "2", DEAD_LETTERS_OF_PROPERTY: ".".join(main.name())}
    try:
        tbl = catalog.create_table(ident, schema=DEAD_LETTER_SCHEMA, location=dead_letter_location(main.location()),
                                   properties=properties)
    except TableAlreadyExistsError:
        return _ours(catalog.load_table(ident), main)
    log.info("created dead-letter table %s for table %s at %s", ".".join(ident), ".".join(main.name()),
             tbl.location())
    return _ours(tbl, main)


def _spec_key(spec: PartitionSpec) -> set[tuple[int, str, str]]:
    return {(f.source_id, str(f.transform), f.name) for f in spec.fields}


def partition_by_text(cfg: TableTopicConfig) -> str:
    """``partition.by`` in canonical form, as recorded in :data:`PARTITION_BY_PROPERTY`."""
    return canonical_partition_by(cfg.partition_by)


def evolve_partition_spec(tbl: Table, cfg: TableTopicConfig, engine: TableEngine | None = None) -> Table:
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
        return _record_problem(tbl, None, engine)
    desired = _desired_spec(tbl.schema(), cfg)
    if isinstance(desired, str):
        return _record_problem(tbl, desired, engine)
    want = _spec_key(desired)
    have = _spec_key(tbl.spec())
    if want == have:
        return _record_problem(tbl, None, engine)
    schema = tbl.schema()
    added: list[tuple[str, str, str]] = []
    for f in desired.fields:
        if (f.source_id, str(f.transform), f.name) not in have:
            column = schema.find_column_name(f.source_id)
            assert column is not None
            added.append((column, str(f.transform), f.name))
    tbl = apply_update(tbl, TableUpdate(
        set_properties={PARTITION_BY_PROPERTY: text},
        remove_properties=(PARTITION_BY_PROBLEM_PROPERTY,) if partition_by_problem(tbl) is not None else (),
        remove_spec_fields=tuple(f.name for f in tbl.spec().fields
                                 if (f.source_id, str(f.transform), f.name) not in want),
        add_spec_fields=tuple(added)), engine)
    log.info("evolved the partition spec of %s to %s (spec id %d) for partition.by=%s", ".".join(tbl.name()),
             tbl.spec(), tbl.spec().spec_id, text)
    return tbl


# ------------------------------------------------------------------------------------------------ a round's commit


class Outcome(StrEnum):
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"  # nothing landed; the round's files were deleted


class CommitOutcomeUnknownError(Exception):
    """The commit may or may not have landed and the table could not be read back to tell: keep the files."""


EXPIRY_BACKSTOP_HOURS = 24
"""With maintenance on, the rounds expire only snapshots this much older than ``expire.snapshot.older.than.hours``."""


@dataclass(frozen=True, slots=True)
class ExpirePolicy:
    """``automq.table.topic.expire.snapshot.*``."""

    enabled: bool = True
    older_than_hours: int = 1
    retain_last: int = 1

    @classmethod
    def settings(cls, cfg: TableTopicConfig) -> ExpirePolicy:
        """The settings as they are (the dead-letter table's commits, the maintenance run)."""
        return cls(cfg.expire_snapshot_enabled, cfg.expire_snapshot_older_than_hours, cfg.expire_snapshot_retain_last)

    @classmethod
    def from_config(cls, cfg: TableTopicConfig) -> ExpirePolicy:
        """What a round's transaction expires on the main table. With ``compaction.enable`` the maintenance run
        expires snapshots (Spark's expiry, which also deletes the files only they referenced: pyiceberg's leaves
        them on disk), so the round expires only what is :data:`EXPIRY_BACKSTOP_HOURS` past the setting: a
        backstop bounding the metadata while the maintenance cannot run (no Spark)."""
        policy = cls.settings(cfg)
        if cfg.compaction_enable:
            return cls(policy.enabled, policy.older_than_hours + EXPIRY_BACKSTOP_HOURS, policy.retain_last)
        return policy


@dataclass(frozen=True, slots=True)
class RoundCommit:
    """What one round commits.

    ``table_offsets`` is the table's ``tabletopic.offsets`` as read when the round began (the base the
    workers were asked to continue from); ``new_offsets`` the next offsets of the partitions that answered.
    """

    commit_id: str
    table_offsets: Mapping[int, int]
    new_offsets: Mapping[int, int]
    data_files: tuple[DataFile, ...] = ()
    watermark: int = -1
    expire: ExpirePolicy = field(default_factory=ExpirePolicy)
    topic_id: str | None = None  # recorded with the offsets; offsets of another topic id are replaced
    dead_letter_files: tuple[DataFile, ...] = ()  # files of the dead-letter table, named in the pending property
    # the commit id of the table's pending dead letters, which the coordinator saw in the dead-letter table
    # (None: there were none): only then may this round replace or clear them
    dead_letters_applied: str | None = None
    # an upsert/CDC round: the merge's staged snapshot, which the round's transaction makes current (no append)
    merge: StagedMerge | None = None
    change_files: tuple[str, ...] = ()  # its change files (deleted when the round is aborted)

    @property
    def paths(self) -> list[str]:
        return [*(f.file_path for f in (*self.data_files, *self.dead_letter_files)), *self.change_files]


@dataclass(frozen=True, slots=True)
class CommitResult:
    outcome: Outcome
    table: Table  # the table after the commit (or as last read)
    attempts: int
    reason: str = ""
    commit_ms: float = 0.0  # time spent in the catalog commit(s)
    # the commit raised (the catalog or the store failed: 5xx, 429, a time-out) and reading the table back decided it
    unknown_outcome: bool = False


def _without_pyiceberg_retries(tbl: Table) -> Table:
    """``tbl`` with pyiceberg's commit retry off. That retry (``commit.retry.num-retries``, default 4) re-applies the
    staged property update on whatever is current without asking us, which would silently move offsets someone
    else has moved (duplicates). Spark's commits keep their retries: this is never written to the table."""
    # An in-memory copy whose properties say "no retries"; commit_transaction reads the retry settings from
    # the base metadata only, and catalogs apply our updates (never this overlay) to the current metadata.
    props = {**tbl.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    meta = tbl.metadata.model_copy(update={"properties": props})
    return Table(tbl.name(), metadata=meta, metadata_location=tbl.metadata_location, io=tbl.io,
                 catalog=tbl.catalog, config=tbl.config)


def snapshots_to_expire(meta: TableMetadata, policy: ExpirePolicy, now_ms: int) -> list[int]:
    """Snapshots older than ``older_than_hours``, except the newest ``retain_last``, the current one and
    any branch/tag head."""
    if not policy.enabled:
        return []
    newest_first = sorted(meta.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    keep = {s.snapshot_id for s in newest_first[: max(1, policy.retain_last)]}
    keep |= {ref.snapshot_id for ref in meta.refs.values()}
    if meta.current_snapshot_id is not None:
        keep.add(meta.current_snapshot_id)
    cutoff = now_ms - policy.older_than_hours * 3_600_000
    return [s.snapshot_id for s in newest_first if s.snapshot_id not in keep and s.timestamp_ms < cutoff]


def _round_properties(tbl: Table, rc: RoundCommit) -> tuple[dict[str, str], tuple[str, ...]]:
    """The table properties the round sets and removes. A round with dead letters names their files and its offsets
    in ``tabletopic.dead-letters.pending``, replacing the previous round's (which the coordinator has seen in the
    dead-letter table first); a round without clears it."""
    stored_topic = tbl.properties.get(TOPIC_ID_PROPERTY)
    other_incarnation = rc.topic_id is not None and stored_topic not in (None, rc.topic_id)
    offsets = {**({} if other_incarnation else committed_offsets(tbl)), **rc.new_offsets}
    props = {OFFSETS_PROPERTY: encode_offsets(offsets), COMMIT_ID_PROPERTY: rc.commit_id}
    if rc.topic_id is not None:
        props[TOPIC_ID_PROPERTY] = rc.topic_id
    if rc.merge is None and rc.data_files:  # rows appended: a key may have several (coordinator.table)
        props[APPENDED_PROPERTY] = "true"
    removed: tuple[str, ...] = ()
    if rc.dead_letter_files:
        props[PENDING_DEAD_LETTERS_PROPERTY] = PendingDeadLetters(
            rc.commit_id, dict(rc.new_offsets), tuple(f.file_path for f in rc.dead_letter_files)).encode()
    elif PENDING_DEAD_LETTERS_PROPERTY in tbl.properties:
        removed = (PENDING_DEAD_LETTERS_PROPERTY,)  # in the dead-letter table (_check_still_valid)
    return props, removed


def _round_summary(rc: RoundCommit) -> dict[str, str]:
    return {SUMMARY_COMMIT_ID: rc.commit_id, SUMMARY_WATERMARK: str(rc.watermark)}


def round_update(tbl: Table, rc: RoundCommit, now_ms: int) -> TableUpdate:
    """The round's single commit over a format v3 ``tbl``, for the table engine: what :func:`build_transaction` does
    on a format v2 table (the snapshots to expire are chosen on ``tbl`` as it is, before the round's snapshot)."""
    props, removed = _round_properties(tbl, rc)
    staged = None if rc.merge is None else rc.merge.snapshot_id
    expire = tuple(s for s in snapshots_to_expire(tbl.metadata, rc.expire, now_ms) if s != staged)
    if staged is not None:
        return TableUpdate(props, removed, publish=staged, expire=expire)
    spec_id = tbl.spec().spec_id
    return TableUpdate(props, removed, append=tuple(AddedFile.of(f, spec_id) for f in rc.data_files),
                       summary=_round_summary(rc), expire=expire)


def build_transaction(tbl: Table, rc: RoundCommit, now_ms: int) -> Transaction:
    """The round's single transaction over ``tbl`` (not committed): the properties, then a fast append of the
    round's data files, possibly none (an offsets-only round still makes a snapshot, so every commit of ours moves
    ``main`` and Iceberg's ``AssertRefSnapshotId`` detects a concurrent committer; its summary carries
    ``tabletopic.commit-id`` and ``tabletopic.watermark``) or the staged merge made current, and the expiry."""
    txn = _without_pyiceberg_retries(tbl).transaction()
    props, removed = _round_properties(tbl, rc)
    if removed:
        txn.remove_properties(*removed)
    txn.set_properties(props)
    if rc.merge is not None:  # publish the merge: main moves to its snapshot (asserting main is where it was)
        ManageSnapshots(txn).set_current_snapshot(rc.merge.snapshot_id)
    else:
        with txn.update_snapshot(snapshot_properties=_round_summary(rc)).fast_append() as append:
            for data_file in rc.data_files:
                append.append_data_file(data_file)
    expired = snapshots_to_expire(txn.table_metadata, rc.expire, now_ms)
    if expired:
        ExpireSnapshots(txn).by_ids(expired).commit()
    return txn


def _check_still_valid(tbl: Table, rc: RoundCommit) -> str | None:
    """Why the round can no longer be committed on ``tbl``, or None."""
    current = committed_offsets(tbl)
    if current != dict(rc.table_offsets):
        return (f"the table's offsets moved under us (another committer?): expected {dict(rc.table_offsets)}, "
                f"found {current} (commit id {tbl.properties.get(COMMIT_ID_PROPERTY)})")
    pending = pending_dead_letters(tbl)
    if pending is not None and pending.commit_id != rc.dead_letters_applied:
        return (f"the dead letters of round {pending.commit_id} are not known to be in the dead-letter table yet "
                f"(the round saw {rc.dead_letters_applied})")
    if rc.merge is not None:
        head = tbl.current_snapshot()
        main = None if head is None else head.snapshot_id
        if tbl.metadata.snapshot_by_id(rc.merge.snapshot_id) is None:
            return f"the merge's snapshot {rc.merge.snapshot_id} is not in the table (expired?)"
        if rc.merge.parent_id != main:
            return (f"the table changed after the merge was computed (it was on snapshot {rc.merge.parent_id}, "
                    f"main is now {main})")
    spec_id = tbl.spec().spec_id
    wrong = [f.file_path for f in rc.data_files if file_spec_id(f) not in (None, spec_id)]
    if wrong:
        # pyiceberg's fast append writes all added files into one manifest of the *current* spec: files of
        # another spec would get wrong partition tuples. The workers redo them with the new spec.
        return f"the partition spec changed to {spec_id} under the round: files {wrong[:3]} have another spec"
    return None


def remove_files(tbl: Table, paths: Iterable[str], *, keep: set[str] | None = None,
                 failed: list[str] | None = None) -> int:
    """Delete ``paths`` (missing ones are fine), except those in ``keep``; returns how many were deleted. Those
    that could not be deleted (the store is down) are appended to ``failed``, for the caller to try again."""
    n = 0
    for path in paths:
        if keep and any(same_path(path, k) for k in keep):
            log.warning("not deleting %s: a snapshot references it", path)
            continue
        try:
            tbl.io.delete(path)
            n += 1
        except FileNotFoundError:
            pass
        except Exception as e:  # best effort: a leftover is an orphan, never a correctness problem
            log.warning("could not delete uncommitted file %s: %s", path, e)
            if failed is not None:
                failed.append(path)
    return n


def resolve_round(catalog: Catalog, ident: tuple[str, ...], commit_id: str, paths: Iterable[str], *,
                  failed: list[str] | None = None) -> tuple[Outcome, Table]:
    """Decide a round whose outcome is unknown by re-reading the table.

    Committed when the table names ``commit_id``; otherwise its files are deleted (sparing any file a
    snapshot references, which cannot happen unless something else committed them) and it is aborted.
    Raises whatever the catalog raises when the table cannot be read: nothing is decided or deleted then.
    """
    tbl = catalog.load_table(ident)
    if commit_landed(tbl, commit_id):
        return Outcome.COMMITTED, tbl
    paths = list(paths)
    if paths:
        remove_files(tbl, paths, keep=referenced_files(tbl), failed=failed)
    return Outcome.ABORTED, tbl


def _attempt(tbl: Table, rc: RoundCommit, now_ms: int, engine: TableEngine | None) -> Callable[[], Table]:
    """One commit attempt of ``rc`` on ``tbl``: pyiceberg's transaction, or the table engine's for format v3."""
    if written_by_writer(tbl):
        update = round_update(tbl, rc, now_ms)
        return lambda: commit_update(tbl, update, engine)
    return build_transaction(tbl, rc, now_ms).commit_transaction


@dataclass(frozen=True, slots=True)
class Retries:
    """How a commit that lost a race to another writer is tried again: up to ``max_retries`` more times, backing
    off with ``sleep``; ``clock`` (wall seconds) stamps the commits."""

    max_retries: int = DEFAULT_MAX_RETRIES
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


DEFAULT_RETRIES = Retries()


def commit_round(tbl: Table, rc: RoundCommit, *, retries: Retries = DEFAULT_RETRIES,
                 engine: TableEngine | None = None, failed: list[str] | None = None) -> CommitResult:
    """Commit ``rc`` on ``tbl`` (the table as of the round's start) exactly once. A format v3 table is committed
    through ``engine`` (:mod:`coordinator.table_writer`), with the same checks and retries. Files of an aborted
    round that could not be deleted are appended to ``failed``.

    A clean conflict guarantees nothing landed: reload, check that the offsets are still the round's base offsets
    and the spec still the files' spec, try again up to ``max_retries`` times; if someone else moved the offsets or
    the retries run out, ABORTED and the files deleted. Any other exception leaves the outcome unknown: the table is
    read back (:func:`resolve_round`); when it cannot be read, :class:`CommitOutcomeUnknownError` is raised and the
    files kept (the caller keeps its PRE_COMMIT checkpoint and resolves later)."""
    max_retries, clock, sleep = retries.max_retries, retries.clock, retries.sleep
    commit_s = 0.0
    for attempt in range(1, max_retries + 2):
        if attempt > 1 or (attempt == 1 and rc.merge is not None):  # a merge's snapshot is newer than ``tbl``
            tbl = tbl.catalog.load_table(tbl.name())
        problem = _check_still_valid(tbl, rc)
        if problem is None and written_by_writer(tbl) and engine is None:
            problem = f"the table is format v{tbl.metadata.format_version} and no table engine is configured"
        if problem is not None:
            log.warning("aborting round %s of %s: %s", rc.commit_id, ".".join(tbl.name()), problem)
            remove_files(tbl, rc.paths, failed=failed)
            return CommitResult(Outcome.ABORTED, tbl, attempt, problem, commit_s * 1000)
        attempt_commit = _attempt(tbl, rc, int(clock() * 1000), engine)
        t0 = time.perf_counter()
        try:
            committed = attempt_commit()
        except (CommitFailedException, ValidationException) as e:
            commit_s += time.perf_counter() - t0
            # Clean failure: nothing landed. Back off a little so that a concurrent committer can finish.
            log.info("commit of round %s conflicted (attempt %d/%d): %s", rc.commit_id, attempt,
                     max_retries + 1, e)
            if attempt <= max_retries:
                sleep(0.05 * 2 ** (attempt - 1) * (1 + random.random()))
            continue
        except Exception as e:
            commit_s += time.perf_counter() - t0
            log.warning("commit of round %s failed with an unknown outcome (%s: %s); re-reading the table",
                        rc.commit_id, type(e).__name__, e)
            try:
                outcome, fresh = resolve_round(tbl.catalog, tbl.name(), rc.commit_id, rc.paths, failed=failed)
            except Exception as e2:
                raise CommitOutcomeUnknownError(
                    f"round {rc.commit_id}: commit raised {type(e).__name__}: {e}; reading the table back "
                    f"raised {type(e2).__name__}: {e2}") from e2
            log.warning("round %s resolved as %s after the unknown outcome", rc.commit_id, outcome)
            return CommitResult(outcome, fresh, attempt, f"unknown outcome resolved: {type(e).__name__}: {e}",
                                commit_s * 1000, unknown_outcome=True)
        commit_s += time.perf_counter() - t0
        return CommitResult(Outcome.COMMITTED, committed, attempt, "", commit_s * 1000)
    reason = f"gave up after {max_retries + 1} conflicting commits"
    log.warning("aborting round %s of %s: %s", rc.commit_id, ".".join(tbl.name()), reason)
    remove_files(tbl, rc.paths, failed=failed)
    return CommitResult(Outcome.ABORTED, tbl, max_retries + 1, reason, commit_s * 1000)


# ------------------------------------------------------------------------------------------------ dead letters


def _dead_letter_file(dlq: Table, path: str, known: Mapping[str, DataFile]) -> DataFile | None:
    """The entry of a pending dead-letter file: as the worker handed it over, else from its Parquet footer (after a
    restart); None when the file is gone (logged: its dead letters are lost, the rest still go in)."""
    if path in known:
        return known[path]
    try:
        return parquet_file_to_data_file(dlq.io, dlq.metadata, path)
    except FileNotFoundError:
        log.error("dead-letter file %s of table %s is gone; its records are not in the table", path,
                  ".".join(dlq.name()))
        return None


def _dead_letter_transaction(dlq: Table, pending: PendingDeadLetters, files: list[DataFile], *, topic_id: str | None,
                             expire: ExpirePolicy, now_ms: int) -> Transaction:
    txn = _without_pyiceberg_retries(dlq).transaction()
    stored_topic = dlq.properties.get(TOPIC_ID_PROPERTY)
    before = {} if topic_id is not None and stored_topic not in (None, topic_id) else committed_offsets(dlq)
    offsets = {**before, **{p: max(o, before.get(p, o)) for p, o in pending.offsets.items()}}
    props = {OFFSETS_PROPERTY: encode_offsets(offsets), COMMIT_ID_PROPERTY: pending.commit_id}
    if topic_id is not None:
        props[TOPIC_ID_PROPERTY] = topic_id
    txn.set_properties(props)
    with txn.update_snapshot(snapshot_properties={SUMMARY_COMMIT_ID: pending.commit_id}).fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    expired = snapshots_to_expire(txn.table_metadata, expire, now_ms)
    if expired:
        ExpireSnapshots(txn).by_ids(expired).commit()
    return txn


def commit_dead_letters(catalog: Catalog, main: Table, cfg: TableTopicConfig, *, known: Iterable[DataFile] = (),
                        topic_id: str | None = None, retries: Retries = DEFAULT_RETRIES) -> Table | None:
    """Append the dead letters ``main`` names (``tabletopic.dead-letters.pending``) to its dead-letter table, once.

    Exactly once across the two tables without a multi-table transaction: the main table's commit decides which
    records are dead letters and names their files; this appends exactly those in a transaction recording the
    round's commit id. The coordinator calls it after every commit with dead letters and again before each round
    and at start-up, so a crash in between is completed later: a skipped record is in the dead-letter table once,
    never also in the main table. The main table references the files until they are appended.

    ``main`` must be freshly loaded. Nothing to do (returns the dead-letter table, or None when ``main`` never had
    dead letters) when the dead-letter table already names the pending round. ``known``: the entries the workers
    handed over (else they are read from the files' footers). Conflicts are retried; an unknown outcome is
    resolved by reading the table back. Raises when it cannot be done now (the caller tries again later, before
    the main table commits anything else); never deletes a file.
    """
    pending = pending_dead_letters(main)
    if pending is None:
        return load_dead_letter_table(catalog, main)
    dlq = load_or_create_dead_letter_table(catalog, main, cfg)
    by_path = {f.file_path: f for f in known}
    problem = ""
    max_retries, clock, sleep = retries.max_retries, retries.clock, retries.sleep
    for attempt in range(1, max_retries + 2):
        if attempt > 1:
            dlq = _ours(catalog.load_table(dlq.name()), main)
        if commit_landed(dlq, pending.commit_id):
            return dlq
        files = [f for path in pending.files if (f := _dead_letter_file(dlq, path, by_path)) is not None]
        txn = _dead_letter_transaction(dlq, pending, files, topic_id=topic_id, expire=ExpirePolicy.settings(cfg),
                                       now_ms=int(clock() * 1000))
        try:
            committed = txn.commit_transaction()
        except (CommitFailedException, ValidationException) as e:
            problem = f"{type(e).__name__}: {e}"
            log.info("dead letters of round %s conflicted (attempt %d/%d): %s", pending.commit_id, attempt,
                     max_retries + 1, e)
            if attempt <= max_retries:
                sleep(0.05 * 2 ** (attempt - 1) * (1 + random.random()))
            continue
        except Exception as e:  # unknown outcome: the next attempt reads the table back first
            problem = f"{type(e).__name__}: {e}"
            log.warning("adding the dead letters of round %s failed with an unknown outcome (%s); re-reading %s",
                        pending.commit_id, problem, ".".join(dlq.name()))
            continue
        log.info("[DEAD_LETTERS] table=%s commit_id=%s files=%d records=%d", ".".join(dlq.name()),
                 pending.commit_id, len(files), sum(f.record_count for f in files))
        return committed
    raise CommitFailedException(f"adding the dead letters of round {pending.commit_id} to "
                                f"{'.'.join(dlq.name())} failed {max_retries + 1} times: {problem}")
