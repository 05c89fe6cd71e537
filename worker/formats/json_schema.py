"""The JSON Schema payload format ("JSON"): a JSON Schema → the Iceberg type of its column, and its payloads (UTF-8
JSON text, as confluent-kafka's ``JSONSerializer`` writes it after the Confluent header) → Arrow values.

Seam: :data:`JSON_SCHEMA` (registered with :mod:`worker.formats.base`), whose decoder maps the schema with
:func:`json_type` (the mapping is listed there) and decodes with :mod:`worker.formats.json_decode`.
References resolve by the name the registry's reference gives or by a referenced schema's ``$id``.

Rules: the mapping is deterministic for one schema (fresh Iceberg ids from 1, top-level fields first); a schema
that cannot become a column (not JSON, a recursive or unknown ``$ref``, an ``allOf`` of different types) raises
:class:`~worker.formats.base.SchemaMappingError` naming why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.converters.base import ConvertedColumn
from worker.formats import json_decode
from worker.formats.base import RegistrySchema, SchemaMappingError, SchemaReference, register
from worker.formats.json_decode import ANY, Arr, Field, JsonColumns, JType, Kind, Leaf, Obj, StrMap, Union

_FORMATS = {"date-time": Kind.TIMESTAMPTZ, "date": Kind.DATE, "time": Kind.TIME, "uuid": Kind.UUID}
_SIMPLE = {"integer": Kind.LONG, "number": Kind.DOUBLE, "boolean": Kind.BOOLEAN}
_SHAPE_KEYWORDS = frozenset({"type", "properties", "additionalProperties", "patternProperties", "items",
                             "prefixItems", "$ref", "enum", "const", "format", "oneOf", "anyOf", "allOf"})
_MAX_DEPTH = 200  # nested schema levels (a deeper schema is refused rather than overflowing the stack)
_MEMBER_NAMES = {Kind.LONG: "integer", Kind.DOUBLE: "number", Kind.BOOLEAN: "boolean", Kind.JSON: "any",
                 Kind.TIMESTAMPTZ: "date_time", Kind.DATE: "date", Kind.TIME: "time", Kind.UUID: "uuid"}

# A walk result: the type (None: only null is allowed) and whether null is allowed.
Walked = tuple[JType | None, bool]


def _pointer(doc: Any, pointer: str) -> Any:
    for raw in [p for p in pointer.split("/") if p]:
        part = raw.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _documents(references: Iterable[SchemaReference], into: dict[str, Any]) -> dict[str, Any]:
    """Every referenced document (references of references included) by the name it is referenced by."""
    for ref in references:
        if ref.name not in into:
            try:
                into[ref.name] = json.loads(ref.schema.schema)
            except ValueError as e:
                raise SchemaMappingError(f"the referenced schema {ref.name} is not JSON: {e}") from None
            _documents(ref.schema.references, into)
    return into


def _kind_name(t: JType) -> str:
    if isinstance(t, Leaf):
        return _MEMBER_NAMES.get(t.kind, "string")
    return "array" if isinstance(t, Arr) else "object"


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 2
    while out in taken:
        out, n = f"{name}_{n}", n + 1
    taken.add(out)
    return out


class _Walker:
    def __init__(self, main: Any, documents: dict[str, Any]) -> None:
        self.main = main
        self.documents = documents  # reference name → document
        self.open: list[str] = []  # the $refs being expanded, outermost first

    def walk(self, node: Any, root: Any, where: str, depth: int = 0) -> Walked:
        """``node`` (inside the document ``root``, at ``where`` for messages) → its type."""
        if depth > _MAX_DEPTH:
            raise SchemaMappingError(f"the schema nests deeper than {_MAX_DEPTH} levels at {where}")
        if node is True or node == {} or not isinstance(node, dict):
            return ANY, True
        if isinstance(node.get("$ref"), str):
            return self._ref(node["$ref"], root, depth)
        if isinstance(node.get("allOf"), list):
            return self._all_of(node, root, where, depth)
        branches = node.get("oneOf", node.get("anyOf"))
        if isinstance(branches, list) and not self._constraints_only(node, branches):
            return self._union([(b, f"{where}/{i}") for i, b in enumerate(branches)], root, depth)
        types = node.get("type")
        if isinstance(types, list):
            rest = {k: v for k, v in node.items() if k != "type"}
            return self._union([({**rest, "type": t}, where) for t in types], root, depth)
        if types is None:
            types = _implied_type(node)
            if types is None:
                return ANY, True
        return self._typed(node, types, root, where, depth)

    def _document(self, target: str) -> Any:
        if target in self.documents:
            return self.documents[target]
        for doc in (self.main, *self.documents.values()):
            if isinstance(doc, dict) and doc.get("$id") == target:
                return doc
        raise SchemaMappingError(f"$ref to {target!r}: no such reference (the schema's references: "
                                 f"{sorted(self.documents) or 'none'})")

    def _ref(self, ref: str, root: Any, depth: int) -> Walked:
        target, _, pointer = ref.partition("#")
        doc = self._document(target) if target else root
        # the key names the document by identity: a local pointer inside a referenced document is that document's
        name = target or next((n for n, d in self.documents.items() if d is root), "")
        key = f"{name}#{pointer}"
        if key in self.open:
            raise SchemaMappingError(f"recursive schema {ref} (it contains itself through "
                                     f"{' → '.join([*self.open, key])}); a table cannot hold it")
        try:
            node = _pointer(doc, pointer)
        except (KeyError, IndexError, ValueError, TypeError):
            raise SchemaMappingError(f"$ref {ref!r} does not resolve") from None
        self.open.append(key)
        try:
            return self.walk(node, doc, key, depth + 1)
        finally:
            self.open.pop()

    @staticmethod
    def _constraints_only(node: dict[str, Any], branches: list[Any]) -> bool:
        """oneOf/anyOf beside a shape that only narrow it (e.g. which properties are required)."""
        has_shape = any(k in node for k in ("type", "properties", "items"))
        return has_shape and all(isinstance(b, dict) and not (_SHAPE_KEYWORDS & b.keys()) for b in branches)

    def _all_of(self, node: dict[str, Any], root: Any, where: str, depth: int) -> Walked:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        parts = [self.walk(b, root, f"{where}/allOf/{i}", depth + 1) for i, b in enumerate(node["allOf"])]
        if _SHAPE_KEYWORDS & rest.keys():
            parts.append(self.walk(rest, root, where, depth + 1))
        nullable = all(n for _, n in parts)
        if any(t is None for t, _ in parts):  # a branch allows only null
            return None, True
        shaped = [t for t, _ in parts if t is not None and t != ANY]
        if not shaped:
            return ANY, nullable
        objects = [t for t in shaped if isinstance(t, Obj)]
        if len(objects) == len(shaped):
            return _merge_objects(objects), nullable
        if all(t == shaped[0] for t in shaped):
            return shaped[0], nullable
        kinds = ", ".join(_kind_name(t) for t in shaped)
        raise SchemaMappingError(f"allOf at {where or '#'} combines different types ({kinds}); a column holds one")

    def _union(self, branches: list[tuple[Any, str]], root: Any, depth: int) -> Walked:
        members: list[tuple[str, JType]] = []
        nullable = False
        taken: set[str] = set()
        for branch, where in branches:
            t, n = self.walk(branch, root, where, depth + 1)
            nullable = nullable or n
            if t is None or any(t == m for _, m in members):
                continue
            members.append((_member_name(branch, t, taken), t))
        types = [t for _, t in members]
        if not types:
            return None, True
        if len(types) == 1:
            return types[0], nullable
        if all(isinstance(t, Leaf) and t.kind in (Kind.LONG, Kind.DOUBLE) for t in types):
            return Leaf(Kind.DOUBLE), nullable
        return Union(tuple(members)), nullable

    def _typed(self, node: dict[str, Any], kind: str, root: Any, where: str, depth: int) -> Walked:
        if kind == "null":
            return None, True
        if kind == "string":
            fmt = node.get("format")
            return Leaf(_FORMATS.get(fmt, Kind.STRING) if isinstance(fmt, str) else Kind.STRING), False
        if kind in _SIMPLE:
            return Leaf(_SIMPLE[kind]), False
        if kind == "array":
            items = node.get("items", True)
            if not isinstance(items, dict | bool) or "prefixItems" in node:
                return Arr(ANY, False), False  # a tuple: its elements as JSON text
            t, n = self.walk(items, root, f"{where}/items", depth + 1)
            return Arr(t or ANY, not n and t is not None), False
        if kind == "object":
            return self._object(node, root, where, depth), False
        raise SchemaMappingError(f"unknown JSON Schema type {kind!r} at {where or '#'}")

    def _object(self, node: dict[str, Any], root: Any, where: str, depth: int) -> JType:
        properties = node.get("properties")
        if isinstance(properties, dict) and properties:
            required = set(node.get("required") or ())
            fields = []
            for name, sub in properties.items():
                t, n = self.walk(sub, root, f"{where}/properties/{name}", depth + 1)
                doc = sub.get("description") if isinstance(sub, dict) else None
                fields.append(Field(name, t or ANY, name in required and not n and t is not None,
                                    doc if isinstance(doc, str) else None))
            return Obj(tuple(fields))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            t, n = self.walk(extra, root, f"{where}/additionalProperties", depth + 1)
            return StrMap(t or ANY, not n and t is not None)
        return ANY


def _implied_type(node: dict[str, Any]) -> str | None:
    """The type a schema without ``type`` implies by its keywords (None: any value)."""
    if {"properties", "additionalProperties", "patternProperties", "required"} & node.keys():
        return "object"
    if {"items", "prefixItems"} & node.keys():
        return "array"
    values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else None
    if not values:
        return None
    kinds = {"null" if v is None else "boolean" if type(v) is bool else "integer" if type(v) is int else
             "number" if type(v) is float else "string" if type(v) is str else "json" for v in values} - {"null"}
    if kinds == {"integer", "number"}:
        return "number"
    return kinds.pop() if len(kinds) == 1 and "json" not in kinds else None


def _member_name(branch: Any, t: JType, taken: set[str]) -> str:
    base = None
    if isinstance(branch, dict):
        ref = branch.get("$ref")
        if isinstance(ref, str):
            target, _, pointer = ref.partition("#")
            base = pointer.rsplit("/", 1)[-1] or target.rsplit("/", 1)[-1].split(".", 1)[0] or None
        elif isinstance(branch.get("title"), str):
            base = branch["title"]
    return _unique(base or _kind_name(t), taken)


def _merge_objects(objects: list[Obj]) -> Obj:
    fields: dict[str, Field] = {}
    for obj in objects:
        for f in obj.fields:
            known = fields.get(f.name)
            if known is None or known.type in (f.type, ANY):
                fields[f.name] = Field(f.name, f.type if known is None or known.type == ANY else known.type,
                                       f.required or (known is not None and known.required), f.doc or
                                       (known.doc if known else None))
            elif f.type != ANY:
                raise SchemaMappingError(f"allOf gives property {f.name} two different types")
    return Obj(tuple(fields.values()))


def json_type(schema: RegistrySchema) -> tuple[JType, bool]:
    """The column shape of a JSON schema and whether a JSON ``null`` document is allowed.
    Raises SchemaMappingError (not JSON, a recursive ``$ref``, an unknown reference, ...).

    - ``string`` → string; with ``format`` ``date-time`` → timestamptz, ``date`` → date, ``time`` → time (UTC time
      of day when the value has an offset), ``uuid`` → uuid (hyphenated form); other formats stay strings.
    - ``integer`` → long, ``number`` → double, ``boolean`` → boolean; ``["integer", "number"]`` → double.
    - ``array`` → list of its ``items`` (elements required unless the items allow null); no ``items``, or a tuple
      (``items`` as a list, ``prefixItems``) → list of JSON text.
    - ``object`` with ``properties`` → struct: a property listed in ``required`` is required unless its schema
      allows null, the others are optional; ``description`` becomes the field's doc. An object with no properties
      and an ``additionalProperties`` schema → map<string, V>; any other object → its JSON text.
    - Nullable: ``"type": [T, "null"]``, or ``oneOf`` / ``anyOf`` with a ``{"type": "null"}`` branch → optional T.
    - ``oneOf`` / ``anyOf`` (and ``type`` lists) of several non-null types → a struct of optional members, one per
      branch, named by the ``$ref`` definition, the ``title`` or the JSON type (``string``, ``integer``,
      ``object``, ...; ``_2``... on a clash); a value lands in the first member it fits. Branches that only add
      constraints to the schema beside them (``required`` sets, bounds) are ignored.
    - ``allOf``: the objects' properties merged (required in any branch → required); branches of different types
      are refused.
    - ``$ref``: ``#/definitions/...``, ``#/$defs/...`` and any other pointer into the document; a reference by the
      name the registry's reference gives (``"address.json"``, ``"address.json#/definitions/X"``) or by a
      referenced schema's ``$id``. A schema that contains itself through ``$ref`` (a tree, a linked list) is
      refused naming the reference.
    - ``{}`` / ``true`` / no type (and no keyword implying one) → string holding the JSON text (a string value as
      itself); ``enum`` / ``const`` without a type → the type of their values.
    """
    try:
        document = json.loads(schema.schema)
    except ValueError as e:
        raise SchemaMappingError(f"the JSON schema is not JSON: {e}") from None
    walker = _Walker(document, _documents(schema.references, {}))
    try:
        t, nullable = walker.walk(document, document, "")
    except RecursionError:
        raise SchemaMappingError("the JSON schema nests too deeply") from None
    return (t or ANY), nullable


@dataclass(frozen=True, slots=True)
class JsonSchemaDecoder:
    """:class:`worker.formats.base.Decoder` of one JSON schema."""

    iceberg_type: IcebergType
    columns: JsonColumns

    def decode(self, payloads: pa.Array, suffix: str) -> ConvertedColumn:
        return json_decode.decode(payloads, self.columns, suffix)


class JsonSchemaFormat:
    """:class:`worker.formats.base.PayloadFormat` for the registry's ``JSON`` schemas."""

    name = "JSON"

    def decoder(self, schema: RegistrySchema, message: tuple[int, ...] | str | None) -> JsonSchemaDecoder:
        t, nullable = json_type(schema)
        iceberg = json_decode.iceberg_type(t)
        return JsonSchemaDecoder(iceberg, JsonColumns.build(t, iceberg, nullable))


JSON_SCHEMA = register(JsonSchemaFormat())
