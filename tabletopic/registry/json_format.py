"""JSON schemas: ``jsonschema`` checks a schema against its draft's metaschema; the compatibility rules are
hand-written (no maintained Python library compares two JSON Schemas).

A reader can read a writer when every document the writer's schema accepts, the reader's accepts too (as
Confluent's rules, on the keywords that carry data shape):

- ``type``: the reader's types cover the writer's (``number`` covers ``integer``); ``enum`` / ``const``: the
  reader's values cover the writer's.
- Objects: each property the writer declares must be readable by the reader's schema for it (or the reader's
  ``additionalProperties``); a property only the reader declares must accept whatever the writer's
  ``additionalProperties`` allows (so adding a property to an open content model breaks BACKWARD, as in
  Confluent); the reader's ``required`` must be required by the writer too, except properties with a default.
- Arrays: ``items`` recursively. Bounds (``minimum``, ``maxLength``, ``minItems``, ...) may only widen;
  ``pattern`` / ``format`` must not appear or change. ``anyOf`` / ``oneOf``: each writer branch must be readable
  by some reader branch.
- ``$ref``: local pointers (``#/definitions/...``) and references to other subjects by the name the reference
  gives (``"$ref": "address.json"``) are followed; recursive schemas are compared once per pair.
Keywords beyond these (``if``/``then``, ``dependentSchemas``, ``patternProperties``, ...) are not compared.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft7Validator, validators
from jsonschema.exceptions import SchemaError

from tabletopic.registry.compat import Dependency, ParsedSchema
from tabletopic.registry.errors import invalid_schema

_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_ANY: dict[str, Any] = {}
_MAX_DEPTH = 64


class JsonSchema:
    """A parsed JSON schema (see :class:`tabletopic.registry.compat.ParsedSchema`)."""

    def __init__(self, document: Any, dependencies: dict[str, Any]) -> None:
        self.document = document
        self.dependencies = dependencies  # reference name → document

    def text(self, normalize: bool) -> str:
        return json.dumps(self.document, separators=(",", ":"), sort_keys=normalize, ensure_ascii=False)

    def can_read(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return ["not a JSON schema"]
        return _Comparison(self, writer).compare(self.document, self.document, writer.document, writer.document, "#")

    def resolve(self, node: Any, root: Any) -> tuple[Any, Any]:
        """Follow ``$ref`` (local pointers and references by name) to the schema node and the document it is in.
        Raises KeyError/ValueError for a reference that leads nowhere."""
        for _ in range(_MAX_DEPTH):
            if not isinstance(node, dict) or not isinstance(node.get("$ref"), str):
                return node, root
            target, _, pointer = node["$ref"].partition("#")
            if target:
                root = self.dependencies[target]
            node = _pointer(root, pointer)
        raise ValueError("too many $ref hops")


def _pointer(doc: Any, pointer: str) -> Any:
    for raw in [p for p in pointer.split("/") if p]:
        part = raw.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _types(node: dict[str, Any]) -> set[str] | None:
    t = node.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _type_changes(r: dict[str, Any], w: dict[str, Any], path: str) -> list[str]:
    rt, wt = _types(r), _types(w)
    if rt is None:
        return []
    if wt is None:
        return [f"{path}: the writer allows any type, the reader only {sorted(rt)}"]
    unread = {t for t in wt if t not in rt and not (t == "integer" and "number" in rt)}
    return [f"{path}: type {sorted(unread)} is written but not read (reader: {sorted(rt)})"] if unread else []


class _Comparison:
    """One reader/writer comparison; pairs already under comparison count as compatible (recursive schemas)."""

    def __init__(self, reader: JsonSchema, writer: JsonSchema) -> None:
        self.reader, self.writer = reader, writer
        self.done: dict[tuple[int, int], list[str]] = {}

    def compare(self, r: Any, r_root: Any, w: Any, w_root: Any, path: str) -> list[str]:
        r, r_root = self.reader.resolve(r, r_root)
        w, w_root = self.writer.resolve(w, w_root)
        if r is False and w is not False:
            return [f"{path}: the reader accepts nothing"]
        if not isinstance(r, dict) or r == _ANY or w is False:
            return []
        if not isinstance(w, dict):
            w = _ANY
        key = (id(r), id(w))
        if key not in self.done:
            self.done[key] = []  # under comparison: a recursive schema meeting itself counts as compatible
            self.done[key] = self._compare(r, r_root, w, w_root, path)
        return self.done[key]

    def _compare(self, r: dict[str, Any], r_root: Any, w: dict[str, Any], w_root: Any, path: str) -> list[str]:
        out = self._scalars(r, w, path)
        if "anyOf" in r or "oneOf" in r or "anyOf" in w or "oneOf" in w:
            return out + self._branches(r, r_root, w, w_root, path)
        out += self._objects(r, r_root, w, w_root, path)
        if "items" in r and isinstance(r["items"], dict | bool):
            out += self.compare(r["items"], r_root, w.get("items", True), w_root, f"{path}/items")
        return out

    def _scalars(self, r: dict[str, Any], w: dict[str, Any], path: str) -> list[str]:
        out = _type_changes(r, w, path)
        for key in ("enum", "const"):
            if key in r:
                allowed = r[key] if key == "enum" else [r[key]]
                written = w.get("enum") if "enum" in w else [w["const"]] if "const" in w else None
                if written is None or any(v not in allowed for v in written):
                    out.append(f"{path}: the reader's {key} does not cover the writer's values")
        for key in _LOWER_BOUNDS:
            if key in r and (key not in w or w[key] < r[key]):
                out.append(f"{path}: {key} narrowed to {r[key]}")
        for key in _UPPER_BOUNDS:
            if key in r and (key not in w or w[key] > r[key]):
                out.append(f"{path}: {key} narrowed to {r[key]}")
        for key in ("pattern", "format"):
            if key in r and r[key] != w.get(key):
                out.append(f"{path}: {key} {r[key]!r} added or changed")
        return out

    def _objects(self, r: dict[str, Any], r_root: Any, w: dict[str, Any], w_root: Any, path: str) -> list[str]:
        rp, wp = r.get("properties", {}), w.get("properties", {})
        r_extra, w_extra = r.get("additionalProperties", True), w.get("additionalProperties", True)
        out = []
        for name, w_sub in wp.items():
            out += self.compare(rp.get(name, r_extra), r_root, w_sub, w_root, f"{path}/properties/{name}")
        for name, r_sub in rp.items():
            if name not in wp:
                out += self.compare(r_sub, r_root, w_extra, w_root, f"{path}/properties/{name} (added)")
        if r_extra is not True:
            out += self.compare(r_extra, r_root, w_extra, w_root, f"{path}/additionalProperties")
        with_default = {n for n, s in rp.items() if isinstance(s, dict) and "default" in s}
        newly = set(r.get("required", ())) - set(w.get("required", ())) - with_default
        if newly:
            out.append(f"{path}: {sorted(newly)} required by the reader but not by the writer")
        return out

    def _branches(self, r: dict[str, Any], r_root: Any, w: dict[str, Any], w_root: Any, path: str) -> list[str]:
        r_branches = r.get("anyOf") or r.get("oneOf") or [r]
        w_branches = w.get("anyOf") or w.get("oneOf") or [w]
        out = []
        for i, wb in enumerate(w_branches):
            if all(self.compare(rb, r_root, wb, w_root, path) for rb in r_branches):
                out.append(f"{path}: the writer's branch {i} is readable by no branch of the reader")
        return out


class JsonFormat:
    name = "JSON"

    def parse(self, text: str, dependencies: Sequence[Dependency]) -> JsonSchema:
        try:
            document = json.loads(text)
            deps = {name: json.loads(dep) for name, dep in dependencies}
            for doc in (*deps.values(), document):
                if not isinstance(doc, dict | bool):
                    raise ValueError("a JSON schema is an object or a boolean")
                validators.validator_for(doc, default=Draft7Validator).check_schema(doc)
            parsed = JsonSchema(document, deps)
            _check_refs(parsed, document, document, 0)
        except SchemaError as exc:
            raise invalid_schema(f"{exc.message} (at {'/'.join(map(str, exc.path)) or 'the root'})") from None
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
        return parsed


def _check_refs(schema: JsonSchema, node: Any, root: Any, depth: int) -> None:
    """Every ``$ref`` resolves (KeyError/ValueError otherwise)."""
    if depth > _MAX_DEPTH * 4:
        raise ValueError("schema nested too deeply")
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            try:
                schema.resolve(node, root)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"$ref {node['$ref']!r} does not resolve ({exc})") from None
        for value in node.values():
            _check_refs(schema, value, root, depth + 1)
    elif isinstance(node, list):
        for value in node:
            _check_refs(schema, value, root, depth + 1)
