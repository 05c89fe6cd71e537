"""PROTOBUF schemas: ``.proto`` text compiled by grpcio-tools' bundled protoc (in a child process, no system
protoc), or the base64 ``FileDescriptorProto`` that confluent-kafka's ``ProtobufSerializer`` registers; checked by
building a ``protobuf`` DescriptorPool (:func:`tabletopic.protobuf_descriptors.build_pool`, shared with the workers:
imports come from the references by the file name they import, the ones confluent-kafka never sends as references
from the installed runtime). The compatibility rules are hand-written (Confluent's, on descriptors):

- a message the writer has and the reader lacks: MESSAGE_REMOVED (incompatible);
- fields matched by number: added or removed fields are compatible, unless ``required`` (proto2) is added or
  removed; a changed kind (scalar ↔ message ↔ enum), a changed message/enum type, or a scalar type outside
  Confluent's wire-compatible groups ({int32, uint32, int64, uint64, bool}, {sint32, sint64},
  {fixed32, sfixed32}, {fixed64, sfixed64}, {string, bytes}) is incompatible; so is ``repeated`` ↔ singular;
- oneofs: a field moved into a oneof the writer already had, or several fields moved into a new oneof, is
  incompatible (one field moving into a new oneof is compatible).

Stored text: the base64 of the deterministic ``FileDescriptorProto`` serialization, for both input forms.
Answers carry this form whatever ``format`` asks (what ``format=serialized`` gives in Confluent's registry); a
``.proto`` text rendering is not produced.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2

from tabletopic.protobuf_descriptors import build_pool, from_base64
from tabletopic.registry.compat import Dependency, ParsedSchema
from tabletopic.registry.errors import invalid_schema

FDP = descriptor_pb2.FileDescriptorProto
FieldProto = descriptor_pb2.FieldDescriptorProto
_PROTOC_TIMEOUT_S = 30
_ABSL_LINE = re.compile(r"^(WARNING: All log messages before absl|[WIEF]\d{4} )")
_SCALAR_GROUPS = [
    {FieldProto.TYPE_INT32, FieldProto.TYPE_UINT32, FieldProto.TYPE_INT64, FieldProto.TYPE_UINT64,
     FieldProto.TYPE_BOOL},
    {FieldProto.TYPE_SINT32, FieldProto.TYPE_SINT64},
    {FieldProto.TYPE_FIXED32, FieldProto.TYPE_SFIXED32},
    {FieldProto.TYPE_FIXED64, FieldProto.TYPE_SFIXED64},
    {FieldProto.TYPE_STRING, FieldProto.TYPE_BYTES},
]
_NAMED = {FieldProto.TYPE_MESSAGE, FieldProto.TYPE_GROUP, FieldProto.TYPE_ENUM}


def _include_dir() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def _compile(name: str, text: str, imports: Sequence[FDP]) -> FDP:
    """``.proto`` text → its descriptor, through protoc in a child process; imports given as descriptors."""
    with tempfile.TemporaryDirectory(prefix="tabletopic-proto-") as tmp:
        root = Path(tmp)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
        known = descriptor_pb2.FileDescriptorSet(file=list(imports))
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
    return next(f for f in out.file if f.name == name)


class ProtobufSchema:
    """A parsed PROTOBUF schema (see :class:`tabletopic.registry.compat.ParsedSchema`)."""

    def __init__(self, fdp: FDP) -> None:
        self.fdp = fdp

    def text(self, normalize: bool) -> str:
        return base64.b64encode(self.fdp.SerializeToString(deterministic=True)).decode("ascii")

    def can_read(self, writer: ParsedSchema) -> list[str]:
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
    if (rf.type in _NAMED) != (wf.type in _NAMED) or (rf.type == FieldProto.TYPE_ENUM) != (
            wf.type == FieldProto.TYPE_ENUM):
        return [f"FIELD_KIND_CHANGED: {at}"]
    if rf.type in _NAMED:
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


class ProtobufFormat:
    name = "PROTOBUF"

    def parse(self, text: str, dependencies: Sequence[Dependency]) -> ProtobufSchema:
        try:
            imports: dict[str, FDP] = {}
            for dep_name, dep_text in dependencies:  # each after its own imports
                dep = self._descriptor(dep_name, dep_text, list(imports.values()))
                dep.name = dep_name  # the path the importing file names it by
                imports[dep_name] = dep
            fdp = self._descriptor("schema.proto", text, list(imports.values()))
            build_pool([*imports.values(), fdp]).FindFileByName(fdp.name)
        # protoc's messages and the pool's refusals (unknown types, duplicate names) all mean an invalid schema
        except Exception as exc:
            raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
        return ProtobufSchema(fdp)

    @staticmethod
    def _descriptor(name: str, text: str, imports: list[FDP]) -> FDP:
        fdp = from_base64(text)
        if fdp is None:
            fdp = _compile(name if name.endswith(".proto") else f"{name}.proto", text, imports)
        if not fdp.name:
            fdp.name = name
        return fdp
