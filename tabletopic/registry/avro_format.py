"""AVRO schemas: Apache Avro's own parser and reader/writer compatibility checker, fastavro's default checks.

- Parsing and compatibility: the ``avro`` package (``avro.schema``, ``avro.compatibility``'s
  ``ReaderWriterCompatibilityChecker``: Avro's schema resolution rules, type promotions, defaults, enums,
  unions, aliases).
- Default values: ``avro`` does not check that a field's default fits its type; ``fastavro.parse_schema`` does,
  so every schema goes through both.
- References: the referenced schemas are parsed first into the same name table, so their named types resolve.
- Stored text: the JSON re-serialized compactly (whitespace never matters); ``normalize`` also sorts the keys of
  every JSON object (their order means nothing in Avro).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import avro.name
import avro.schema
import fastavro
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from tabletopic.registry.compat import Dependency, ParsedSchema
from tabletopic.registry.errors import invalid_schema


class AvroSchema:
    """A parsed AVRO schema (see :class:`tabletopic.registry.compat.ParsedSchema`)."""

    def __init__(self, document: Any, schema: avro.schema.Schema) -> None:
        self.document = document
        self.schema = schema

    def text(self, normalize: bool) -> str:
        return json.dumps(self.document, separators=(",", ":"), sort_keys=normalize, ensure_ascii=False)

    def can_read(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return ["not an AVRO schema"]
        result = ReaderWriterCompatibilityChecker().get_compatibility(  # type: ignore[no-untyped-call]
            self.schema, writer.schema)
        if result.compatibility is SchemaCompatibilityType.compatible:
            return []
        kinds = ", ".join(sorted({i.name.upper() for i in result.incompatibilities})) or "INCOMPATIBLE"
        return [f"{kinds}: {'; '.join(sorted(result.messages))} (at {', '.join(sorted(result.locations))})"]


class AvroFormat:
    name = "AVRO"

    def parse(self, text: str, dependencies: Sequence[Dependency]) -> AvroSchema:
        names = avro.name.Names(validate_names=True)
        named: dict[str, Any] = {}  # fastavro's table of named types, filled by the references
        try:
            # Avro references by type name, defined in the referenced text: each text once
            for dep in dict.fromkeys(text for _, text in dependencies):
                dep_doc = json.loads(dep)
                avro.schema.make_avsc_object(dep_doc, names)
                fastavro.parse_schema(dep_doc, named_schemas=named)
            document = json.loads(text)
            schema = avro.schema.make_avsc_object(document, names)
            fastavro.parse_schema(document, named_schemas=named)
        # Any failure of the third-party parsers on user input means an invalid schema (RecursionError included).
        except Exception as exc:
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
        return AvroSchema(document, schema)
