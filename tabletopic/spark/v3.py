"""Format v3 tables: table creation and the broker's commits, with the Iceberg Java API.

:mod:`coordinator.table_writer` decides each commit; this applies it once, on exactly the metadata it was decided
on (:func:`commit_table_update`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tabletopic.spark.jvm import current_snapshot_id, iceberg_catalog, iceberg_table, java_identifier, jclass

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# pyiceberg 0.12 cannot write format v3 metadata; these apply what the broker's committer decided, once.


def create_table(  # noqa: PLR0913  (Iceberg-Java's Catalog.createTable, plus the session and catalog)
        session: SparkSession, catalog_name: str, identifier: Sequence[str], *, schema_json: str,
        spec_json: str, properties: Mapping[str, str], location: str | None = None) -> int:
    """Create a table (Iceberg-Java's ``Catalog.createTable``: fresh field ids, as pyiceberg assigns them) of
    ``schema_json`` and ``spec_json`` (Iceberg's JSON forms, pyiceberg's ``model_dump_json()``) with ``properties``
    (``format-version`` among them); returns its format version. Java's AlreadyExistsException when it exists."""
    schema = jclass(session, "org.apache.iceberg.SchemaParser").fromJson(schema_json)
    spec = jclass(session, "org.apache.iceberg.PartitionSpecParser").fromJson(schema, spec_json)
    props = jclass(session, "java.util.HashMap")()
    for key, value in properties.items():
        props.put(key, value)
    table = iceberg_catalog(session, catalog_name).createTable(java_identifier(session, identifier), schema, spec,
                                                        location, props)
    return int(table.operations().current().formatVersion())


def _java_value(session: SparkSession, type_id: str, value: Any) -> Any:
    """A partition value (Iceberg's internal representation, as pyiceberg's partition records hold it) as the Java
    object Iceberg keeps for a partition field of type ``type_id``."""
    if value is None:
        return None
    if type_id in ("INTEGER", "DATE"):
        return jclass(session, "java.lang.Integer").valueOf(str(int(value)))
    if type_id in ("LONG", "TIME", "TIMESTAMP", "TIMESTAMP_NANO"):
        return jclass(session, "java.lang.Long").valueOf(str(int(value)))
    if type_id in ("FLOAT", "DOUBLE"):
        return jclass(session, f"java.lang.{type_id.title()}").valueOf(str(float(value)))
    if type_id == "DECIMAL":
        return jclass(session, "java.math.BigDecimal")(str(value))
    if type_id == "UUID":
        return jclass(session, "java.util.UUID").fromString(str(value))
    if type_id in ("BINARY", "FIXED"):
        return jclass(session, "java.nio.ByteBuffer").wrap(bytearray(value))
    if type_id == "BOOLEAN":
        return bool(value)
    return str(value)


def _data_file(session: SparkSession, table: Any, metrics_config: Any, entry: Mapping[str, Any]) -> Any:
    """A DataFile of a Parquet file the broker's workers wrote: its size and metrics (record count, column sizes,
    value/null counts, bounds per the table's metrics config) read from the file and its footer, as Iceberg-Java's
    writers record them; the partition values as the worker computed them."""
    spec = table.specs().get(int(entry["spec_id"]))
    input_file = table.io().newInputFile(entry["path"])
    metrics = jclass(session, "org.apache.iceberg.parquet.ParquetUtil").fileMetrics(input_file, metrics_config)
    builder = jclass(session, "org.apache.iceberg.DataFiles").builder(spec).withPath(entry["path"]) \
        .withFormat(jclass(session, "org.apache.iceberg.FileFormat").PARQUET) \
        .withFileSizeInBytes(input_file.getLength()).withMetrics(metrics)
    if spec.isPartitioned():
        partition_type = spec.partitionType()
        data = jclass(session, "org.apache.iceberg.PartitionData")(partition_type)
        for i, value in enumerate(entry["partition"]):
            type_id = str(partition_type.fields().get(i).type().typeId().name())
            data.set(i, _java_value(session, type_id, value))
        builder = builder.withPartition(data)
    return builder.build()


def _update_spec(session: SparkSession, txn: Any, removed: Sequence[str], added: Sequence[Sequence[str]]) -> None:
    """Partition fields removed, then added (``(source column, transform, name)``, transforms as Iceberg names
    them: ``identity``, ``bucket[8]``, ``truncate[4]``, ``day``...), each in its own update as pyiceberg does."""
    if removed:
        update = txn.updateSpec()
        for name in removed:
            update = update.removeField(name)
        update.commit()
    if added:
        expressions = jclass(session, "org.apache.iceberg.expressions.Expressions")
        update = txn.updateSpec()
        for column, transform, name in added:
            kind, _, param = transform.partition("[")
            term = (expressions.ref(column) if kind == "identity" else
                    getattr(expressions, kind)(column, int(param.rstrip("]"))) if param else
                    getattr(expressions, kind)(column))
            update = update.addField(name, term)
        update.commit()


def commit_table_update(session: SparkSession, catalog_name: str, identifier: Sequence[str], base_location: str,
                        update: Mapping[str, Any]) -> int | None:
    """Commit ``update`` (:meth:`coordinator.table_writer.TableUpdate.plain`) on the table as it is at the metadata
    file ``base_location``, in one Iceberg transaction whose catalog pointer moves with a single compare-and-set:
    properties set and removed, partition fields removed and added, then a fast append of ``append`` with
    ``summary`` or main moved to the staged snapshot ``publish``, then the snapshots ``expire`` removed (their
    files kept). Returns main's head afterwards.

    Never retried here: Iceberg-Java's ``commitTransaction`` would re-apply the property update on whatever table is
    current after a lost swap (another committer's offsets overwritten), so the transaction's metadata is committed
    with the table operations' own compare-and-set instead. pyiceberg's CommitFailedException when the table is not
    at ``base_location`` (nothing done); Java's CommitFailedException when another commit won the swap (its manifests
    stay behind as orphans); anything else leaves the outcome unknown."""
    from pyiceberg.exceptions import CommitFailedException

    table = iceberg_table(session, catalog_name, identifier)
    txn = table.newTransaction()
    start = txn.startMetadata()
    if str(start.metadataFileLocation()) != base_location:
        raise CommitFailedException(f"table {'.'.join(identifier)} is at {start.metadataFileLocation()}, not at "
                                    f"{base_location}: it changed since the commit was decided")
    if update["set_properties"] or update["remove_properties"]:
        properties = txn.updateProperties()
        for key, value in update["set_properties"].items():
            properties = properties.set(key, value)
        for key in update["remove_properties"]:
            properties = properties.remove(key)
        properties.commit()
    _update_spec(session, txn, update["remove_spec_fields"], update["add_spec_fields"])
    if update["publish"] is not None:
        txn.manageSnapshots().setCurrentSnapshot(int(update["publish"])).commit()
    elif update["append"] is not None:
        append = txn.newFastAppend()
        metrics_config = jclass(session, "org.apache.iceberg.MetricsConfig").forTable(table)
        for entry in update["append"]:
            append = append.appendFile(_data_file(session, table, metrics_config, entry))
        for key, value in update["summary"].items():
            append = append.set(key, value)
        append.commit()
    if update["expire"]:
        # only these: no age cut-off of the table's own (expireOlderThan(0) keeps every other snapshot)
        expire = txn.expireSnapshots().expireOlderThan(0).cleanExpiredFiles(False)
        for snapshot_id in update["expire"]:
            expire = expire.expireSnapshotId(int(snapshot_id))
        expire.commit()
    txn.underlyingOps().commit(start, txn.currentMetadata())
    table.refresh()
    return current_snapshot_id(table)
