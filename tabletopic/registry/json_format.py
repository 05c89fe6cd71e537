"""JSON schemas: ``jsonschema`` checks a schema against its draft's metaschema; the compatibility rules are
hand-written (no maintained Python library compares two JSON Schemas).

Seam: :class:`JsonFormat` (the ``JSON`` schema type of :mod:`tabletopic.registry.compat`): ``parse`` gives a
:class:`JsonSchema`, whose ``can_read`` compares a reader with a writer (:class:`_Comparison`, the rules listed
there) and ``resolve`` follows ``$ref``: local pointers, and other subjects by the name their reference gives.

Rule: a reader can read a writer when every document the writer's schema accepts, the reader's accepts too, as
Confluent's rules decide it (``SchemaDiff``, ``CombinedSchemaDiff``, ``ArraySchemaDiff``) on the keywords that
carry data shape; keywords beyond those are not compared.
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
_COMBINERS = ("anyOf", "oneOf", "allOf")
# the keywords that constrain a value; an object without any (only title, description, unknown keys ...) accepts all
_VALIDATION = frozenset((
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "items",
    "additionalItems", "prefixItems", "contains", "minItems", "maxItems", "uniqueItems", "minContains", "maxContains",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern",
    "format", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "unevaluatedItems",
    "unevaluatedProperties"))
_MAX_DEPTH = 64


class JsonSchema:
    """A parsed JSON schema (see :class:`tabletopic.registry.compat.ParsedSchema`)."""

    def __init__(self, document: Any, dependencies: dict[str, Any]) -> None:
        self.document = document
        self.dependencies = dependencies  # reference name → document

    def text(self, normalize: bool) -> str:
        return json.dumps(self.document, separators=(",", ":"), sort_keys=normalize, ensure_ascii=False)

    def formatted(self, fmt: str) -> str:
        return self.text(False)

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


def _validating(node: Any) -> bool:
    """Whether a schema constrains values at all (``true`` and annotation-only objects do not)."""
    return node is False or (isinstance(node, dict) and any(k in _VALIDATION for k in node))


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
    """One reader/writer comparison; pairs already under comparison count as compatible (recursive schemas, so
    each pair is compared once).

    - ``type``: the reader's types cover the writer's (``number`` covers ``integer``); ``enum`` / ``const``: the
      reader's values cover the writer's.
    - Objects: each property the writer declares must be readable by the reader's schema for it (or the reader's
      ``additionalProperties``); a property only the reader declares must accept whatever the writer's
      ``additionalProperties`` allows (so adding a property to an open content model breaks BACKWARD, as in
      Confluent); the reader's ``required`` must be required by the writer too, except properties with a default.
    - Arrays (Confluent's ``ArraySchemaDiff``): ``items`` as one schema recursively; tuples (``items`` as a list)
      position by position, where a position the reader adds to a tuple the writer left open
      (``additionalItems`` absent or true) must take anything, and ``additionalItems`` may only widen. Bounds
      (``minimum``, ``maxLength``, ``minItems``, ...) may only widen; ``pattern`` / ``format`` must not appear or
      change.
    - Combined schemas (Confluent's ``SchemaDiff`` / ``CombinedSchemaDiff``): a one-branch ``anyOf`` / ``oneOf`` /
      ``allOf`` stands for its branch; a reader ``anyOf`` / ``oneOf`` reads a plain writer through one branch; a
      plain reader reads a writer ``allOf`` through one branch; two combinations must keep their kind (or widen
      it to ``anyOf``), not lose branches of an ``anyOf`` / ``oneOf`` nor gain branches of an ``allOf``, and pair
      every branch with one it reads. An object with keywords of several kinds is the ``allOf`` of them, as
      Confluent parses it.
    - ``not``: both sides' excluded schemas compared the other way round; ``not`` on one side only is
      incompatible.
    - ``$ref`` is followed (:meth:`JsonSchema.resolve`). Keywords beyond these (``if``/``then``,
      ``dependentSchemas``, ``patternProperties``, ...) are not compared.
    """

    def __init__(self, reader: JsonSchema, writer: JsonSchema) -> None:
        self.reader, self.writer = reader, writer
        self.done: dict[tuple[int, int], list[str]] = {}
        self.shapes: dict[int, tuple[dict[str, Any], tuple[str, list[Any]]]] = {}

    def compare(self, r: Any, r_root: Any, w: Any, w_root: Any, path: str) -> list[str]:
        r, r_root = self.reader.resolve(r, r_root)
        w, w_root = self.writer.resolve(w, w_root)
        if r is False and w is not False:
            return [f"{path}: the reader accepts nothing"]
        if not isinstance(r, dict) or not _validating(r) or w is False:
            return []
        if not isinstance(w, dict):
            w = _ANY
        key = (id(r), id(w))
        if key not in self.done:
            self.done[key] = []  # under comparison: a recursive schema meeting itself counts as compatible
            self.done[key] = self._compare(r, r_root, w, w_root, path)
        return self.done[key]

    def _shape(self, node: dict[str, Any]) -> tuple[str, list[Any]]:
        """What a schema object is to the rules, as Confluent's parser (everit) builds it: ``("anyOf" / "oneOf" /
        "allOf", branches)``, ``("not", [schema])``, or ``("plain", [node])``; an object with keywords of several
        kinds (``type`` with ``oneOf``, ``not`` with ``minimum`` ...) is the ``allOf`` of its parts. The parts
        are kept alive here: comparisons are remembered by object identity."""
        found = self.shapes.get(id(node))
        if found is None:
            base = {k: v for k, v in node.items() if k not in (*_COMBINERS, "not")}
            parts: list[tuple[str, list[Any]]] = [("plain", [base])] if _validating(base) else []
            parts += [(k, list(node[k])) for k in _COMBINERS if isinstance(node.get(k), list)]
            parts += [("not", [node["not"]])] if "not" in node else []
            if len(parts) > 1:
                parts = [("allOf", [{k: branches} if k in _COMBINERS else {"not": branches[0]} if k == "not"
                                    else branches[0] for k, branches in parts])]
            found = self.shapes[id(node)] = (node, parts[0] if parts else ("plain", [node]))
        return found[1]

    def _compare(self, r: dict[str, Any], r_root: Any, w: dict[str, Any], w_root: Any, path: str) -> list[str]:
        (r_kind, r_parts), (w_kind, w_parts) = r_shape, w_shape = self._shape(r), self._shape(w)
        if r_kind in _COMBINERS or w_kind in _COMBINERS:
            return self._combined(r_shape, r_root, w_shape, w_root, path)
        if r_kind == "not" and w_kind == "not":
            # the reader must exclude no more than the writer did: the writer's excluded set reads the reader's
            if _Comparison(self.writer, self.reader).compare(w_parts[0], w_root, r_parts[0], r_root, path):
                return [f"{path}/not: the reader excludes values the writer's schema allows"]
            return []
        if r_kind == "not" or w_kind == "not":
            return [f"{path}: one schema is a 'not', the other is not (Confluent: TYPE_CHANGED)"]
        return (self._scalars(r, w, path) + self._objects(r, r_root, w, w_root, path)
                + self._arrays(r, r_root, w, w_root, path))

    def _combined(self, r_shape: tuple[str, list[Any]], r_root: Any, w_shape: tuple[str, list[Any]], w_root: Any,
                  path: str) -> list[str]:
        """Confluent's rules for combined schemas (``SchemaDiff.compareTypes``, ``CombinedSchemaDiff``)."""
        (r_kind, r_parts), (w_kind, w_parts) = r_shape, w_shape

        def reads(rb: Any, wb: Any) -> bool:
            return not self.compare(rb, r_root, wb, w_root, path)

        if w_kind not in _COMBINERS:  # a one-branch reader, or one branch of its anyOf / oneOf, reads the writer
            if (len(r_parts) == 1 or r_kind != "allOf") and any(reads(rb, w_parts[0]) for rb in r_parts):
                return []
            return [f"{path}: the writer's schema is readable by no branch of the reader's {r_kind}"]
        if r_kind not in _COMBINERS:  # the reader reads the writer's one branch, or one branch of its allOf
            if (len(w_parts) == 1 or w_kind == "allOf") and any(reads(r_parts[0], wb) for wb in w_parts):
                return []
            return [f"{path}: the reader's schema reads no branch standing for the writer's {w_kind}"]
        r_one, w_one = len(r_parts) == 1, len(w_parts) == 1
        if r_kind != w_kind and not (r_kind == "anyOf" or (r_one and w_one) or (w_one and r_kind == "oneOf")
                                     or (r_one and w_kind == "allOf")):
            return [f"{path}: {w_kind} changed to {r_kind}"]
        r_unique, w_unique = _unique(r_parts), _unique(w_parts)
        out = []
        if len(w_unique) < len(r_unique) and r_kind == "allOf":
            out.append(f"{path}: the reader's allOf has more branches")
        if len(w_unique) > len(r_unique) and w_kind in ("anyOf", "oneOf"):
            out.append(f"{path}: the reader's {r_kind} has fewer branches")
        edges = {i: [j for j, rb in enumerate(r_unique) if reads(rb, wb)] for i, wb in enumerate(w_unique)}
        if _matching(edges) < min(len(r_unique), len(w_unique)):
            out.append(f"{path}: the branches of the {w_kind} do not each find one of the reader's {r_kind}")
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

    def _arrays(self, r: dict[str, Any], r_root: Any, w: dict[str, Any], w_root: Any, path: str) -> list[str]:
        """``items`` for every item, the positions of tuples (``items`` as a list) and ``additionalItems``, as
        Confluent's ``ArraySchemaDiff`` compares them: a tuple position only one side has is fine while the other
        side's tuple is closed (or takes it in ``additionalItems``), and when the reader lacks it and is open; a
        position the reader adds where the writer's tuple was open must take anything."""
        r_items, w_items = r.get("items"), w.get("items")
        out: list[str] = []
        if r_items is not None and not isinstance(r_items, list):
            out += self.compare(r_items, r_root, True if isinstance(w_items, list) else w_items, w_root,
                                f"{path}/items")
        r_tuple = r_items if isinstance(r_items, list) else []
        w_tuple = w_items if isinstance(w_items, list) else []
        r_more, w_more = r.get("additionalItems", True), w.get("additionalItems", True)
        for i in range(max(len(r_tuple), len(w_tuple))):
            at = f"{path}/items/{i}"
            if i < len(r_tuple) and i < len(w_tuple):
                out += self.compare(r_tuple[i], r_root, w_tuple[i], w_root, at)
            elif i < len(w_tuple):  # the writer's position, beyond the reader's tuple
                if r_more is False and w_tuple[i] is not False:
                    out.append(f"{at}: the writer has an item where the reader's tuple is closed")
                elif r_more is not False and r_more is not True:
                    out += self.compare(r_more, r_root, w_tuple[i], w_root, at)
            elif w_more is True:  # the reader's position, where the writer's tuple was open
                if r_tuple[i] is not True and _validating(r_tuple[i]):
                    out.append(f"{at}: the reader adds an item where the writer allowed anything")
            elif w_more is not False:
                out += self.compare(r_tuple[i], r_root, w_more, w_root, at)
        if w_more is not False and r_more is False:
            out.append(f"{path}/additionalItems: the reader refuses items beyond its tuple")
        elif w_more is not False and r_more is not True:
            out += self.compare(r_more, r_root, w_more, w_root, f"{path}/additionalItems")
        return out


def _unique(parts: list[Any]) -> list[Any]:
    return list({json.dumps(p, sort_keys=True): p for p in parts}.values())


def _matching(edges: dict[int, list[int]]) -> int:
    """The size of a maximum matching of a bipartite graph (left i → the right nodes it may pair with)."""
    owner: dict[int, int] = {}

    def pair(i: int, seen: set[int]) -> bool:
        for j in edges[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or pair(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return sum(pair(i, set()) for i in edges)


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
