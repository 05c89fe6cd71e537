"""Schema evolution: the table's schema unioned by name with the one the broker's workers ask for."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabletopic.spark.jvm import describe_exception, iceberg_table, jclass

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# attempts of a schema commit that lost the catalog's compare-and-set to another committer (the broker's rounds)
SCHEMA_COMMIT_ATTEMPTS = 4
_COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"


def evolve_schema(session: SparkSession, catalog_name: str, identifier: Sequence[str], schema_json: str) -> int:
    """Union the table's schema with ``schema_json`` (Iceberg's JSON schema form, which pyiceberg's
    ``Schema.model_dump_json()`` writes) in the Spark driver; returns the table's current schema id.

    Why not ``ALTER TABLE`` text: Spark SQL has no uuid, time or fixed type, so such columns could not be added.
    ``UpdateSchema.unionByNameWith`` is the Iceberg-Java operation Spark's own schema changes drive, run here in
    the Spark driver's JVM. Fields are matched by name (the ids in ``schema_json`` are ignored) and:
    - new fields are added, at the top level and inside structs, list-element and map-value structs; a new field
      is always added as optional, even when ``schema_json`` marks it required (existing rows have no value);
    - int → long, float → double and decimal precision widening (same scale) are applied; required → optional too;
    - a field missing from ``schema_json`` is kept; a narrower type in ``schema_json`` (long where the table has
      int... the other way round) leaves the column as it is; an optional field never becomes required;
    - any other type change (int → string, decimal scale, struct ↔ primitive) is refused with Java's
      IllegalArgumentException ("Cannot change column type: ...") and nothing is committed.
    A commit that loses the catalog's compare-and-set to another committer (the broker's rounds) is redone on the
    refreshed table, up to ``SCHEMA_COMMIT_ATTEMPTS`` times; with nothing to add, nothing is committed.
    """
    new_schema = jclass(session, "org.apache.iceberg.SchemaParser").fromJson(schema_json)
    table = iceberg_table(session, catalog_name, identifier)
    for attempt in range(1, SCHEMA_COMMIT_ATTEMPTS + 1):
        try:
            table.updateSchema().unionByNameWith(new_schema).commit()
            break
        except Exception as exc:
            if describe_exception(exc)[0] != _COMMIT_FAILED or attempt == SCHEMA_COMMIT_ATTEMPTS:
                raise
            log.info("schema commit of %s lost to another commit (attempt %d): retrying on the refreshed table",
                     ".".join(identifier), attempt)
            table.refresh()
    table.refresh()
    return int(table.schema().schemaId())
