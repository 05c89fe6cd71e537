"""PROTOBUF schemas: ``.proto`` text compiled by grpcio-tools' bundled protoc (in a child process, no system
protoc), or the base64 ``FileDescriptorProto`` that confluent-kafka's ``ProtobufSerializer`` registers; checked by
building a ``protobuf`` DescriptorPool (:func:`tabletopic.protobuf_descriptors.build_pool`, shared with the
workers).

Seam: :class:`ProtobufFormat` (``parse`` gives a :class:`ProtobufSchema`, whose ``can_read`` holds the
hand-written compatibility rules, Confluent's ``FieldSchemaDiff`` / ``MessageSchemaDiff`` on descriptors) and
:func:`stored_text` for texts an older version stored.

Rules: both input forms are stored and answered as the one ``.proto`` text
:func:`tabletopic.registry.protobuf_text.render` writes (as Confluent's registry stores text), so the same schema
sent as text and as a descriptor gets one id; a schema is taken only when that text compiles back to the same
rendering, and ``format=serialized`` answers the descriptor protoc compiles from it (what the workers read).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import pkgutil
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool

from tabletopic.protobuf_descriptors import build_pool, builtin_file, from_base64, is_builtin
from tabletopic.registry.compat import Dependency, ParsedSchema
from tabletopic.registry.errors import invalid_schema
from tabletopic.registry.protobuf_text import render

FDP = descriptor_pb2.FileDescriptorProto
FieldProto = descriptor_pb2.FieldDescriptorProto
MAIN_FILE = "schema.proto"  # the file name a schema is compiled under (its imports name the others)
_PROTOC_TIMEOUT_S = 30
_ABSL_LINE = re.compile(r"^(WARNING: All log messages before absl|[WIEF]\d{4} )")
_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)\s*;", re.MULTILINE)
_MAP_ENTRY_OPTION = re.compile(r"\boption\s+map_entry\s*=\s*true\s*;")
_SCALAR_GROUPS = [
    {FieldProto.TYPE_INT32, FieldProto.TYPE_UINT32, FieldProto.TYPE_INT64, FieldProto.TYPE_UINT64,
     FieldProto.TYPE_BOOL, FieldProto.TYPE_ENUM},
    {FieldProto.TYPE_SINT32, FieldProto.TYPE_SINT64},
    {FieldProto.TYPE_FIXED32, FieldProto.TYPE_SFIXED32},
    {FieldProto.TYPE_FIXED64, FieldProto.TYPE_SFIXED64},
    {FieldProto.TYPE_STRING, FieldProto.TYPE_BYTES},
]
_MESSAGES = {FieldProto.TYPE_MESSAGE, FieldProto.TYPE_GROUP}


def _include_dir() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


@functools.lru_cache(maxsize=256)
def _protoc(name: str, text: str, imports: tuple[bytes, ...]) -> bytes:
    """The serialized descriptor protoc (a child process) compiles ``text`` into, as file ``name``; ``imports``: the
    serialized descriptors of the files it may import beyond ``google/protobuf/*``. Raises ValueError with protoc's
    messages."""
    with tempfile.TemporaryDirectory(prefix="tabletopic-proto-") as tmp:
        root = Path(tmp)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        known = descriptor_pb2.FileDescriptorSet(file=[FDP.FromString(raw) for raw in imports])
        (root / "imports.pb").write_bytes(known.SerializeToString())
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{_include_dir()}",
               f"--descriptor_set_in={root / 'imports.pb'}", f"--descriptor_set_out={root / 'out.pb'}", name]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S,
                              check=False)
        if done.returncode != 0:
            # protoc's own messages, without abseil's start-up warnings or the temporary directory
            lines = [ln for ln in (done.stderr or done.stdout).replace(str(root) + "/", "").splitlines()
                     if ln.strip() and not _ABSL_LINE.match(ln)]
            raise ValueError("; ".join(lines)[:2000] or f"protoc exited with {done.returncode}")
        out = descriptor_pb2.FileDescriptorSet()
        out.ParseFromString((root / "out.pb").read_bytes())
    return next(f for f in out.file if f.name == name).SerializeToString(deterministic=True)


def _builtin_imports(text: str, given: set[str]) -> list[FDP]:
    """The bundled files (google/type/*, confluent/*) ``text`` imports that no reference gives, with their own
    imports; protoc finds google/protobuf/* in grpcio-tools' include directory itself."""
    found: dict[str, FDP] = {}

    def add(name: str) -> None:
        if name in given or name in found or name.startswith("google/protobuf/"):
            return
        raw = builtin_file(name)
        if raw is not None:
            fdp = FDP.FromString(raw)
            for dep in fdp.dependency:
                add(dep)
            found[name] = fdp

    for m in _IMPORT.finditer(text):
        add(m.group(1))
    return list(found.values())


def _compile(name: str, text: str, imports: Sequence[FDP]) -> FDP:
    """``.proto`` text → its descriptor; imports given as descriptors, bundled ones added."""
    files = [*imports, *_builtin_imports(text, {f.name for f in imports})]
    return FDP.FromString(_protoc(name, text, tuple(f.SerializeToString(deterministic=True) for f in files)))


def _mark_map_entries(scope: str, messages: Sequence[descriptor_pb2.DescriptorProto]) -> int:
    """Mark as map entries the nested ``XEntry {key = 1; value = 2}`` messages a repeated field of their parent
    uses (what an explicit ``option map_entry = true`` declared); how many."""
    marked = 0
    for m in messages:
        full = f"{scope}.{m.name}" if scope else m.name
        repeated = {f.type_name for f in m.field
                    if f.label == FieldProto.LABEL_REPEATED and f.type == FieldProto.TYPE_MESSAGE}
        for n in m.nested_type:
            if (not n.options.map_entry and n.name.endswith("Entry") and f".{full}.{n.name}" in repeated
                    and sorted((f.number, f.name) for f in n.field) == [(1, "key"), (2, "value")]):
                n.options.map_entry = True
                marked += 1
        marked += _mark_map_entries(full, m.nested_type)
    return marked


def _from_text(name: str, text: str, imports: Sequence[FDP]) -> FDP:
    """Compile ``text``; the Java serializer's explicit map-entry messages (``option map_entry = true``, which
    protoc refuses) become the ``map<K, V>`` fields they stand for."""
    try:
        return _compile(name, text, imports)
    except ValueError as exc:
        if "map_entry should not be set explicitly" not in str(exc):
            raise
        stripped, count = _MAP_ENTRY_OPTION.subn("", text)
        fdp = _compile(name, stripped, imports)
        if _mark_map_entries(fdp.package, fdp.message_type) != count:
            raise
        return fdp


@functools.lru_cache(maxsize=1)
def _bundled_texts() -> dict[str, str]:
    """The rendered text of every bundled file → its import path (a bundled file registered as a subject of its
    own, as confluent-kafka does with ``skip.known.types=false``, keeps its name: the pool holds it already)."""
    modules = ["any", "api", "descriptor", "duration", "empty", "field_mask", "source_context", "struct",
               "timestamp", "type", "wrappers"]
    names = [f"google/protobuf/{m}.proto" for m in modules]
    spec = importlib.util.find_spec("google.type")  # googleapis-common-protos
    found = pkgutil.iter_modules(spec.submodule_search_locations or []) if spec is not None else []
    names += [f"google/type/{m.name.removesuffix('_pb2')}.proto" for m in found if m.name.endswith("_pb2")]
    names += ["confluent/meta.proto", "confluent/type/decimal.proto"]
    out: dict[str, str] = {}
    for name in names:
        raw = builtin_file(name)
        if raw is not None:
            fdp = FDP.FromString(raw)
            try:
                out[render(fdp, build_pool([fdp]))] = name
            except (ValueError, TypeError):
                continue
    return out


def _file_name(text: str, given: FDP | None) -> str:
    if given is not None:
        return given.name if is_builtin(given.name) else MAIN_FILE
    package = _PACKAGE.search(text)
    if package is not None and package.group(1).startswith(("google.", "confluent")):
        return _bundled_texts().get(text, MAIN_FILE)
    return MAIN_FILE


class ProtobufSchema:
    """A parsed PROTOBUF schema (see :class:`tabletopic.registry.compat.ParsedSchema`): the descriptor protoc
    compiles from its stored text, and that text."""

    def __init__(self, fdp: FDP, text: str, pool: descriptor_pool.DescriptorPool) -> None:
        self.fdp = fdp
        self._text = text
        self._pool = pool

    def text(self, normalize: bool) -> str:
        # normalized as Confluent does: fields and enum values in number order, imports sorted
        return render(self.fdp, self._pool, normalize=True) if normalize else self._text

    def formatted(self, fmt: str) -> str:
        if fmt == "serialized":
            return base64.b64encode(self.fdp.SerializeToString(deterministic=True)).decode("ascii")
        return self._text

    def can_read(self, writer: ParsedSchema) -> list[str]:
        """Confluent's rules (``FieldSchemaDiff`` / ``MessageSchemaDiff``), on descriptors:

        - a message the writer has and the reader lacks: MESSAGE_REMOVED (incompatible);
        - fields matched by number: added or removed fields are compatible, unless ``required`` (proto2) is added
          or removed; a changed kind (scalar ↔ message), a changed message type, or a scalar type outside
          Confluent's wire-compatible groups ({int32, uint32, int64, uint64, bool, every enum}, {sint32, sint64},
          {fixed32, sfixed32}, {fixed64, sfixed64}, {string, bytes}) is incompatible; so is ``repeated`` ↔
          singular. An enum is a general number, as in Confluent: int32 → enum, enum → int64 and one enum →
          another are compatible;
        - oneofs: a field moved into a oneof the writer already had, or several fields moved into a new oneof, is
          incompatible (one field moving into a new oneof is compatible).
        """
        if not isinstance(writer, ProtobufSchema):
            return ["not a PROTOBUF schema"]
        readers = dict(_messages(self.fdp.package, self.fdp.message_type))
        out: list[str] = []
        for full_name, w in _messages(writer.fdp.package, writer.fdp.message_type):
            r = readers.get(full_name)
            if r is None:
                out.append(f"MESSAGE_REMOVED: {full_name}")
            else:
                out += _message_changes(full_name, r, w)
        return out


def _messages(scope: str, messages: Sequence[descriptor_pb2.DescriptorProto]
              ) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    for m in messages:
        full = f"{scope}.{m.name}" if scope else m.name
        yield full, m
        yield from _messages(full, m.nested_type)


def _message_changes(where: str, r: descriptor_pb2.DescriptorProto, w: descriptor_pb2.DescriptorProto) -> list[str]:
    out: list[str] = []
    r_fields = {f.number: f for f in r.field}
    w_fields = {f.number: f for f in w.field}
    for number in sorted(r_fields.keys() | w_fields.keys()):
        rf, wf = r_fields.get(number), w_fields.get(number)
        at = f"{where} field {number}"
        if rf is None or wf is None:
            one = rf or wf
            assert one is not None
            if one.label == FieldProto.LABEL_REQUIRED:
                out.append(f"REQUIRED_FIELD_{'ADDED' if wf is None else 'REMOVED'}: {at} ({one.name})")
            continue
        out += _field_changes(at, rf, wf)
    out += _oneof_changes(where, r, w)
    return out


def _field_changes(at: str, rf: FieldProto, wf: FieldProto) -> list[str]:
    if (rf.type in _MESSAGES) != (wf.type in _MESSAGES):
        return [f"FIELD_KIND_CHANGED: {at}"]
    if rf.type in _MESSAGES:
        if rf.type_name != wf.type_name:
            return [f"FIELD_NAMED_TYPE_CHANGED: {at} ({wf.type_name} → {rf.type_name})"]
    elif rf.type != wf.type and not any(rf.type in g and wf.type in g for g in _SCALAR_GROUPS):
        return [f"FIELD_SCALAR_KIND_CHANGED: {at} ({FieldProto.Type.Name(wf.type)} → {FieldProto.Type.Name(rf.type)})"]
    if (rf.label == FieldProto.LABEL_REPEATED) != (wf.label == FieldProto.LABEL_REPEATED):
        return [f"FIELD_LABEL_CHANGED: {at} (repeated ↔ singular)"]
    if (rf.label == FieldProto.LABEL_REQUIRED) != (wf.label == FieldProto.LABEL_REQUIRED):
        return [f"REQUIRED_FIELD_{'ADDED' if rf.label == FieldProto.LABEL_REQUIRED else 'REMOVED'}: {at}"]
    return []


def _real_oneof(m: descriptor_pb2.DescriptorProto, f: FieldProto) -> str | None:
    """The oneof a field belongs to (proto3 ``optional``'s synthetic oneofs do not count)."""
    if not f.HasField("oneof_index") or f.proto3_optional:
        return None
    return m.oneof_decl[f.oneof_index].name


def _oneof_changes(where: str, r: descriptor_pb2.DescriptorProto, w: descriptor_pb2.DescriptorProto) -> list[str]:
    w_oneofs = {_real_oneof(w, f) for f in w.field} - {None}
    moved: dict[str, list[int]] = {}
    w_fields = {f.number: f for f in w.field}
    for f in r.field:
        oneof, wf = _real_oneof(r, f), w_fields.get(f.number)
        if oneof is not None and wf is not None and _real_oneof(w, wf) is None:
            moved.setdefault(oneof, []).append(f.number)
    out = []
    for oneof, numbers in sorted(moved.items()):
        if oneof in w_oneofs:
            out.append(f"FIELD_MOVED_TO_EXISTING_ONEOF: {where} fields {numbers} into {oneof}")
        elif len(numbers) > 1:
            out.append(f"MULTIPLE_FIELDS_MOVED_TO_ONEOF: {where} fields {numbers} into {oneof}")
    return out


def _imports(dependencies: Sequence[Dependency]) -> dict[str, FDP]:
    """The referenced files by the path they are imported by, each compiled after its own imports."""
    imports: dict[str, FDP] = {}
    for dep_name, dep_text in dependencies:
        dep = from_base64(dep_text)
        if dep is None:
            name = dep_name if dep_name.endswith(".proto") else f"{dep_name}.proto"
            dep = _from_text(name, dep_text, list(imports.values()))
        dep.name = dep_name
        imports[dep_name] = dep
    return imports


def _load(text: str, dependencies: Sequence[Dependency]) -> tuple[FDP, dict[str, FDP], descriptor_pool.DescriptorPool]:
    """The schema's descriptor (a base64 one as given, text compiled), its imports and the pool holding them.
    Imports come from the references, by the file name they are imported by; the files Confluent bundles
    (``google/protobuf/*``, ``google/type/*``, ``confluent/meta.proto``, ``confluent/type/decimal.proto``) from the
    installed runtime when no reference gives them."""
    imports = _imports(dependencies)
    given = from_base64(text)
    name = _file_name(text, given)
    fdp = given if given is not None else _from_text(name, text, list(imports.values()))
    fdp.name = name
    pool = build_pool([*imports.values(), fdp])
    pool.FindFileByName(fdp.name)
    return fdp, imports, pool


class ProtobufFormat:
    name = "PROTOBUF"

    def parse(self, text: str, dependencies: Sequence[Dependency]) -> ProtobufSchema:
        try:
            fdp, imports, pool = _load(text, dependencies)
            rendered = render(fdp, pool)
        # protoc's messages and the pool's refusals (unknown types, duplicate names) all mean an invalid schema
        except Exception as exc:
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
        if rendered == text:
            return ProtobufSchema(fdp, rendered, pool)  # compiled from this very text: it is its own rendering
        try:
            again = _compile(fdp.name, rendered, list(imports.values()))
            again_pool = build_pool([*imports.values(), again])
            same = render(again, again_pool) == rendered
        except Exception as exc:
            raise invalid_schema(f"the schema written as .proto text (how the registry keeps it) does not compile: "
                                 f"{type(exc).__name__}: {exc}") from None
        if not same:
            raise invalid_schema("the schema written as .proto text (how the registry keeps it) compiles to another "
                                 "schema")
        return ProtobufSchema(again, rendered, again_pool)


def stored_text(text: str, dependencies: Sequence[Dependency]) -> str:
    """The text for a schema an older version stored as a base64 descriptor: its rendering, without the protoc
    round trip a registration makes (none is run for base64 texts). Other texts, and descriptors that do not
    render, come back as they are."""
    if from_base64(text) is None:
        return text
    try:
        fdp, _, pool = _load(text, dependencies)
        return render(fdp, pool)
    except Exception:
        return text
