"""Converters: a record's key or value bytes → the values of a table column (interface in
:mod:`worker.converters.base`).

Importing this package registers the built-in converters: :mod:`~worker.converters.raw`,
:mod:`~worker.converters.string` and :mod:`~worker.converters.schemaless` (the legacy ``schema.type=schemaless``
columns), :mod:`~worker.converters.schema_registry` (``by_schema_id``, ``by_latest_schema``) and
:mod:`~worker.converters.plain_json` (``json``). A new converter is a new module here, imported below.
"""

from worker.converters import plain_json, raw, schema_registry, schemaless, string
from worker.converters.base import ConvertedColumn, Converter, RecordPart, converter, register, registered

BUILT_IN = (raw.RAW, string.STRING, schemaless.SCHEMALESS, schema_registry.BY_SCHEMA_ID,
            schema_registry.BY_LATEST_SCHEMA, plain_json.JSON)

# What a column gets when the configured converter does not produce its type (a table someone else changed): the
# first of these that produces the column's type, else raw (then cast to the column's type as it is).
FALLBACKS = (string.STRING, raw.RAW)

__all__ = ["BUILT_IN", "FALLBACKS", "ConvertedColumn", "Converter", "RecordPart", "converter", "register", "registered"]
