"""AVRO schemas: Apache Avro's own parser and reader/writer compatibility checker, fastavro's default checks.

Seam: :class:`AvroFormat` (``parse`` gives an :class:`AvroSchema`; every schema goes through both the ``avro``
package, which does not check that a field's default fits its type, and ``fastavro.parse_schema``, which does;
referenced schemas are parsed first into the same name table) and :func:`stored_text` for texts an older version
stored. ``AvroSchema.can_read`` is ``avro.compatibility``'s ``ReaderWriterCompatibilityChecker`` (Avro's
resolution rules, type promotions, defaults, enums, unions, aliases).

Rule: texts are stored in Confluent's canonical form, what Java Avro's ``Schema.toString`` writes
(:class:`_Canonical`), so spellings of one schema that differ in key order or in ignored attributes get one text,
hence one id.
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

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_NAMED = {"record", "error", "enum", "fixed"}
_RESERVED = {"type", "name", "namespace", "doc", "fields", "items", "values", "symbols", "size", "aliases"}
_FIELD_RESERVED = {"name", "type", "doc", "default", "order", "aliases"}


class _Canonical:
    """Writes schema documents (already checked by the parsers) as Java Avro's ``Schema.toString`` does: the
    attributes Avro defines in its own order (``type``, ``name``, ``namespace``, ``doc``, ``fields`` ...), other
    attributes after them as given, attributes Avro ignores dropped (``{"type": "int", "name": "x"}`` is
    ``"int"``), namespaces written only where they change, types of referenced schemas by name. ``normalize``
    sorts the other attributes and the aliases too; ``format=resolved`` writes the referenced types inline.

    ``defined``: every named type seen so far by full name (its document and namespace); ``known``: the names
    written already, which later uses give by name."""

    def __init__(self, normalize: bool) -> None:
        self.normalize = normalize
        self.defined: dict[str, tuple[dict[str, Any], str | None]] = {}
        self.known: set[str] = set()

    def schema(self, node: Any, space: str | None) -> Any:
        if isinstance(node, list):
            return [self.schema(branch, space) for branch in node]
        if isinstance(node, str):
            return node if node in _PRIMITIVES else self.reference(node, space)
        kind = node["type"]
        if not isinstance(kind, str):
            return self.schema(kind, space)
        if kind in _NAMED:
            return self.named(node, space, space)
        extra = self.props(node, _RESERVED)
        if kind == "array":
            return {"type": "array", "items": self.schema(node["items"], space), **extra}
        if kind == "map":
            return {"type": "map", "values": self.schema(node["values"], space), **extra}
        if kind in _PRIMITIVES:
            return {"type": kind, **extra} if extra else kind
        return self.reference(kind, space)

    def reference(self, name: str, space: str | None) -> Any:
        candidates = [name] if "." in name else [f"{space}.{name}" if space else name, name]
        full = next((c for c in candidates if c in self.defined), candidates[0])
        if full not in self.known and full in self.defined:  # a referenced schema's type, written inline
            node, own_space = self.defined[full]
            return self.named(node, space, own_space)
        return _qualified(full, space)

    def named(self, node: dict[str, Any], space: str | None, enclosing: str | None) -> Any:
        """A named type used where the namespace is ``space``; ``enclosing``: the namespace it was defined in."""
        name = str(node["name"])
        ns: str | None = node.get("namespace", enclosing) if "." not in name else name.rpartition(".")[0]
        short, ns = name.rpartition(".")[2], ns or None
        full = f"{ns}.{short}" if ns else short
        self.defined.setdefault(full, (node, enclosing))
        if full in self.known:
            return _qualified(full, space)
        self.known.add(full)
        kind = node["type"]
        out: dict[str, Any] = {"type": kind, "name": short}
        if ns != space:
            out["namespace"] = ns or ""
        if isinstance(node.get("doc"), str):
            out["doc"] = node["doc"]
        if kind in ("record", "error"):
            out["fields"] = [self.field(f, ns) for f in node["fields"]]
        elif kind == "enum":
            out["symbols"] = node["symbols"]
            if "default" in node:
                out["default"] = node["default"]
        else:
            out["size"] = node["size"]
        out.update(self.props(node, (_RESERVED | {"default"}) if kind == "enum" else _RESERVED))
        aliases = [_qualified(a if "." in a or not ns else f"{ns}.{a}", ns) for a in node.get("aliases") or ()]
        if aliases:
            out["aliases"] = self.ordered(aliases)
        return out

    def field(self, f: dict[str, Any], space: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": f["name"], "type": self.schema(f["type"], space)}
        if isinstance(f.get("doc"), str):
            out["doc"] = f["doc"]
        if "default" in f:
            out["default"] = f["default"]
        order = str(f.get("order") or "ascending").lower()
        if order != "ascending":
            out["order"] = order
        if f.get("aliases"):
            out["aliases"] = self.ordered([str(a) for a in f["aliases"]])
        out.update(self.props(f, _FIELD_RESERVED))
        return out

    def props(self, node: dict[str, Any], reserved: set[str]) -> dict[str, Any]:
        keys = [k for k in node if k not in reserved]
        return {k: node[k] for k in (sorted(keys) if self.normalize else keys)}

    def ordered(self, items: list[str]) -> list[str]:
        unique = list(dict.fromkeys(items))
        return sorted(unique) if self.normalize else unique


def _qualified(full: str, space: str | None) -> str:
    """A type's name as written where the namespace is ``space``: short when its own namespace is that one (or
    none), else full."""
    ns, _, short = full.rpartition(".")
    return short if not ns or ns == space else full


def _canonical(document: Any, dependencies: Sequence[Any], normalize: bool, inline_references: bool = False) -> str:
    writer = _Canonical(normalize)
    for dep in dependencies:
        writer.schema(dep, None)
    if inline_references:
        writer.known.clear()
    return json.dumps(writer.schema(document, None), separators=(",", ":"), ensure_ascii=False)


def stored_text(text: str, dependencies: Sequence[Dependency]) -> str:
    """The canonical text of a schema an older version stored as given (it was checked then: only rewritten, not
    parsed again); the text itself when it cannot be."""
    try:
        return _canonical(json.loads(text), [json.loads(t) for t in dict.fromkeys(t for _, t in dependencies)], False)
    except Exception:  # not a schema document after all: kept as it is
        return text


class AvroSchema:
    """A parsed AVRO schema (see :class:`tabletopic.registry.compat.ParsedSchema`)."""

    def __init__(self, document: Any, schema: avro.schema.Schema, dependencies: Sequence[Any] = ()) -> None:
        self.document = document
        self.schema = schema
        self.dependencies = list(dependencies)  # the referenced documents, each after the ones it references

    def text(self, normalize: bool) -> str:
        return _canonical(self.document, self.dependencies, normalize)

    def formatted(self, fmt: str) -> str:
        return _canonical(self.document, self.dependencies, False, inline_references=fmt == "resolved")

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
        dep_docs: list[Any] = []
        try:
            # Avro references by type name, defined in the referenced text: each text once
            for dep in dict.fromkeys(text for _, text in dependencies):
                dep_doc = json.loads(dep)
                avro.schema.make_avsc_object(dep_doc, names)
                fastavro.parse_schema(dep_doc, named_schemas=named)
                dep_docs.append(dep_doc)
            document = json.loads(text)
            schema = avro.schema.make_avsc_object(document, names)
            fastavro.parse_schema(document, named_schemas=named)
            parsed = AvroSchema(document, schema, dep_docs)
            parsed.text(False)  # the canonical writer walks the document as well
        # Any failure of the third-party parsers on user input means an invalid schema (RecursionError included).
        except Exception as exc:
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
        return parsed
