"""The broker's table engine: :class:`coordinator.engine.TableEngine` over the Spark side process.

:class:`SparkTableEngine` turns each of the coordinator's calls into one :class:`~tabletopic.spark.service.SparkService`
operation and the side process's errors into the engine's: the process could not run it
(:class:`~tabletopic.spark.service.SparkServiceError`) → :class:`~coordinator.engine.EngineUnavailableError`; Spark
refused it for what it was given (:data:`REFUSALS`) → :class:`~coordinator.engine.EngineRefusedError`; it failed
otherwise → :class:`~coordinator.engine.EngineOperationError`. The format v3 writes raise pyiceberg's errors where a
pyiceberg commit would (:data:`COMMIT_ERRORS`).

Rules: blocking (the coordinator's and the maintenance's threads); never imports pyspark.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError, ValidationException

from coordinator.contract import CHANGE_OFFSET_COLUMN, CHANGE_OP_COLUMN, CHANGE_PARTITION_COLUMN
from coordinator.engine import EngineOperationError, EngineRefusedError, EngineUnavailableError
from coordinator.merge import MergeRequest, MergeResult
from tabletopic.faults import InjectedFaultError, fail_point
from tabletopic.spark.service import SparkOperationError, SparkService, SparkServiceError

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    from coordinator.table_writer import TableUpdate

REFUSALS = frozenset({"AnalysisException", "ParseException", "IllegalArgumentException",
                      "UnsupportedOperationException", "KeyError", "ValueError", "TypeError", "AssertionError"})
"""What a Spark operation raises (the JVM's class or the side process's Python one, unqualified) when it is refused
for what it was given, not for an outage: a merge refused so is not retried, it blocks the table's rounds."""

COMMIT_ERRORS: Mapping[str, type[Exception]] = {"CommitFailedException": CommitFailedException,
                                                "ValidationException": ValidationException,
                                                "AlreadyExistsException": TableAlreadyExistsError}
"""The format v3 writes' failures that pyiceberg names: a commit that did not land (the table moved, a lost
compare-and-set), a failed validation, a table that exists. Anything else leaves the outcome unknown."""


@contextlib.contextmanager
def _engine_errors(known: Mapping[str, type[Exception]] | None = None) -> Iterator[None]:
    """The side process's errors as the engine's (``known``: Spark's kinds raised as these exceptions instead)."""
    try:
        yield
    except SparkOperationError as e:
        kind = e.kind.rsplit(".", 1)[-1]
        mapped = (known or {}).get(kind)
        if mapped is not None:
            raise mapped(e.message) from e
        error = EngineRefusedError if kind in REFUSALS else EngineOperationError
        raise error(e.op, e.kind, e.message) from e
    except SparkServiceError as e:
        raise EngineUnavailableError(str(e)) from e


class SparkTableEngine:
    """The :class:`coordinator.engine.TableEngine` of the broker: every operation runs in the Spark side process."""

    def __init__(self, spark: SparkService) -> None:
        self._spark = spark

    def evolve_schema(self, identifier: tuple[str, ...], schema_json: str) -> None:
        """:func:`tabletopic.spark.schema.evolve_schema`; a type change Iceberg refuses is EngineRefusedError."""
        with _engine_errors():
            self._spark.evolve_schema(identifier, schema_json)

    def merge(self, identifier: tuple[str, ...], request: MergeRequest) -> MergeResult:
        """Stage an upsert/CDC round's merge (:func:`tabletopic.spark.merge.merge_changes`)."""
        try:
            fail_point("merge-refused", identifier[-1])
        except InjectedFaultError as e:  # tests: a merge Spark refuses
            raise EngineRefusedError("merge", type(e).__name__, str(e)) from e
        with _engine_errors():
            return MergeResult.from_spark(self._spark.merge(
                identifier, paths=request.paths, keys=request.keys, stage_id=request.stage_id,
                op_column=CHANGE_OP_COLUMN, order_columns=(CHANGE_PARTITION_COLUMN, CHANGE_OFFSET_COLUMN),
                rewrite=request.rewrite))

    def create_table(self, identifier: tuple[str, ...], schema: Schema, spec: PartitionSpec,
                     properties: Mapping[str, str], location: str | None = None) -> None:
        """:func:`tabletopic.spark.v3.create_table`."""
        with _engine_errors(COMMIT_ERRORS):
            self._spark.create_table(identifier, schema_json=schema.model_dump_json(),
                                     spec_json=spec.model_dump_json(), properties=properties, location=location)

    def commit_update(self, identifier: tuple[str, ...], base_metadata_location: str, update: TableUpdate) -> None:
        """:func:`tabletopic.spark.v3.commit_table_update`, once."""
        with _engine_errors(COMMIT_ERRORS):
            self._spark.commit_table(identifier, base_location=base_metadata_location, update=update.plain())

    def rewrite_data_files(self, identifier: tuple[str, ...], options: Mapping[str, str]) -> dict[str, int]:
        """:func:`tabletopic.spark.maintenance.rewrite_data_files`."""
        with _engine_errors():
            return self._spark.rewrite_data_files(identifier, options)

    def rewrite_manifests(self, identifier: tuple[str, ...]) -> dict[str, int]:
        """:func:`tabletopic.spark.maintenance.rewrite_manifests`."""
        with _engine_errors():
            return self._spark.rewrite_manifests(identifier)

    def expire_snapshots(self, identifier: tuple[str, ...], older_than_ms: int, retain_last: int) -> dict[str, int]:
        """:func:`tabletopic.spark.maintenance.expire_snapshots`."""
        with _engine_errors():
            return self._spark.expire_snapshots(identifier, older_than_ms, retain_last)

    def remove_orphan_files(self, identifier: tuple[str, ...], candidates: Sequence[tuple[str, int]],
                            older_than_ms: int) -> list[str]:
        """:func:`tabletopic.spark.maintenance.remove_orphan_files`."""
        with _engine_errors():
            return self._spark.remove_orphan_files(identifier, candidates, older_than_ms)
