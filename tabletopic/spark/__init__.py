"""Spark: the only package that imports pyspark, and only in the Spark side process and ``tabletopic sql``.

- :mod:`~tabletopic.spark.session`: sessions on the broker's catalog (``s3://`` through S3A), their settings;
- :mod:`~tabletopic.spark.jvm`: the driver JVM from Python (errors, health, Java classes, Iceberg-Java tables);
- one module per family of the side process's operations, each a function of a session:
  :mod:`~tabletopic.spark.sql`, :mod:`~tabletopic.spark.schema` (schema evolution), :mod:`~tabletopic.spark.merge`
  (upsert/CDC merges), :mod:`~tabletopic.spark.v3` (format v3 creation and commits),
  :mod:`~tabletopic.spark.maintenance` (compaction, expiry, orphan files);
- :mod:`~tabletopic.spark.service`: the side process (its client :class:`SparkService` and the child's loop; the
  child runs ``python -m tabletopic.spark``);
- :mod:`~tabletopic.spark.engine`: :class:`~tabletopic.spark.engine.SparkTableEngine`, the coordinator's
  :class:`coordinator.engine.TableEngine` over the side process.

Importing the package starts nothing and imports no pyspark: the operation modules import it inside their functions.
The names below are those other modules, tests and benchmarks use.
"""

from tabletopic.spark.maintenance import expire_snapshots, remove_orphan_files, rewrite_data_files, rewrite_manifests
from tabletopic.spark.merge import last_change_per_key, merge_changes
from tabletopic.spark.schema import evolve_schema
from tabletopic.spark.service import (
    APP_NAME,
    NOT_STARTED,
    RESTARTING,
    RUNNING,
    STATES,
    STOPPED,
    SparkError,
    SparkOperationError,
    SparkService,
    SparkServiceError,
    SparkServiceTimeoutError,
    SparkStatus,
    read_status,
)
from tabletopic.spark.session import (
    SIDE_PROCESS_CONF,
    SparkUnavailableError,
    catalog_conf,
    heap_mib,
    jdbc_catalog_uri,
    s3a_conf,
    spark_conf,
    spark_session,
    stop_session,
)
from tabletopic.spark.sql import sql_rows
from tabletopic.spark.v3 import commit_table_update, create_table

__all__ = [
    "APP_NAME",
    "NOT_STARTED",
    "RESTARTING",
    "RUNNING",
    "SIDE_PROCESS_CONF",
    "STATES",
    "STOPPED",
    "SparkError",
    "SparkOperationError",
    "SparkService",
    "SparkServiceError",
    "SparkServiceTimeoutError",
    "SparkStatus",
    "SparkUnavailableError",
    "catalog_conf",
    "commit_table_update",
    "create_table",
    "evolve_schema",
    "expire_snapshots",
    "heap_mib",
    "jdbc_catalog_uri",
    "last_change_per_key",
    "merge_changes",
    "read_status",
    "remove_orphan_files",
    "rewrite_data_files",
    "rewrite_manifests",
    "s3a_conf",
    "spark_conf",
    "spark_session",
    "sql_rows",
    "stop_session",
]
