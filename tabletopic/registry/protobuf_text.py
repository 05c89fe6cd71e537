"""``.proto`` text of a ``FileDescriptorProto``: the form the registry stores and answers PROTOBUF schemas in, as
Confluent's registry does (base64 descriptors only with ``format=serialized``).

One rendering for every input, so the same schema registered as ``.proto`` text (the Java serializer) and as a base64
descriptor (confluent-kafka's Python serializer) gets one text, hence one id. The rendering:

- names types fully qualified with a leading dot (``.shop.Order.Line``), as Confluent writes a descriptor;
- writes map fields as ``map<K, V>`` and proto2 groups as ``group``, never their synthetic messages;
- writes ``json_name`` only where it differs from protoc's default, and proto2 ``default`` values;
- keeps the order of fields, of messages (top-level and nested, map entries included: message indexes count
  them) and of enums, so the descriptor protoc compiles from the text is the one it was written from;
- writes every option, custom ones too (``(confluent.field_meta) = { doc: "x" }``), read through a descriptor
  pool that knows their extensions; an option it cannot read raises ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_encoding, text_format, unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

FDP = descriptor_pb2.FileDescriptorProto
MessageProto = descriptor_pb2.DescriptorProto
FieldProto = descriptor_pb2.FieldDescriptorProto
_MAX_FIELD_NUMBER = 536_870_911
_MAX_ENUM_NUMBER = 2_147_483_647
_NAMED = {FieldProto.TYPE_MESSAGE, FieldProto.TYPE_ENUM, FieldProto.TYPE_GROUP}
_INDENT = "  "


def default_json_name(name: str) -> str:
    """protoc's ``json_name`` for a field name: underscores dropped, the letter after one upper-cased."""
    out: list[str] = []
    upper = False
    for c in name:
        if c == "_":
            upper = True
        else:
            out.append(c.upper() if upper else c)
            upper = False
    return "".join(out)


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            "\\": "\\\\", "'": "\\'", '"': '\\"'}


def _quote(text: str) -> str:
    """A string literal protoc reads back as ``text`` (UTF-8 kept, control characters escaped)."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\{ord(c):03o}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                         for c in text) + '"'


def _number(value: float | int) -> str:
    if isinstance(value, float):
        return repr(value)  # inf, -inf and nan are protoc's own spellings too
    return str(value)


def _block(header: str, sections: Sequence[Sequence[str]]) -> list[str]:
    """``header {`` + the non-empty sections, indented, a blank line apart + ``}`` (``header {}`` when empty)."""
    filled = [s for s in sections if s]
    if not filled:
        return [header + "}"]
    out = [header]
    for i, lines in enumerate(filled):
        if i:
            out.append("")
        out += [_INDENT + ln if ln else ln for ln in lines]
    out.append("}")
    return out


def _range(start: int, last: int, highest: int) -> str:
    if start == last:
        return str(start)
    return f"{start} to {'max' if last >= highest else last}"


def _real_oneof(f: FieldProto) -> int | None:
    return f.oneof_index if f.HasField("oneof_index") and not f.proto3_optional else None


class _Renderer:
    def __init__(self, fdp: FDP, pool: descriptor_pool.DescriptorPool | None, normalize: bool) -> None:
        self.fdp, self.pool, self.normalize = fdp, pool, normalize
        self.implicit_labels = fdp.syntax in ("proto3", "editions")

    # ---- the file ----

    def file(self) -> str:
        f = self.fdp
        if f.syntax == "editions":
            head = [f'edition = "{descriptor_pb2.Edition.Name(f.edition).removeprefix("EDITION_")}";']
        else:
            head = [f'syntax = "{f.syntax or "proto2"}";']
        if f.package:
            head.append(f"package {f.package};")
        public, weak = set(f.public_dependency), set(f.weak_dependency)
        deps = sorted(enumerate(f.dependency), key=lambda d: d[1]) if self.normalize else enumerate(f.dependency)
        imports = [f'import {"public " if i in public else "weak " if i in weak else ""}"{name}";' for i, name in deps]
        types: list[str] = []
        for m in f.message_type:
            types += self.message(m, f.package)
        for e in f.enum_type:
            types += self.enum(e)
        services: list[str] = []
        for s in f.service:
            services += self.service(s)
        sections = [head, imports, [f"option {o};" for o in self.options(f.options)], types,
                    self.extends(f.extension), services]
        return "\n\n".join("\n".join(s) for s in sections if s) + "\n"

    # ---- messages ----

    def message(self, m: MessageProto, scope: str, header: str | None = None) -> list[str]:
        full = f"{scope}.{m.name}" if scope else m.name
        nested = list(m.nested_type)
        index = {f".{full}.{n.name}": i for i, n in enumerate(nested)}
        # map entries and groups are written with their field, not as messages of their own
        owned = {index[f.type_name]: f for f in m.field if f.type_name in index and (
            f.type == FieldProto.TYPE_GROUP
            or (nested[index[f.type_name]].options.map_entry and f.label == FieldProto.LABEL_REPEATED))}
        done: set[int] = set()

        def messages_before(position: int) -> list[str]:
            """The plain nested messages declared before the synthetic one at ``position`` (protoc numbers nested
            messages in declaration order, map entries and groups included)."""
            out: list[str] = []
            for i in range(position):
                if i not in done and i not in owned:
                    done.add(i)
                    out += self.message(nested[i], full)
            return out

        fields = sorted(m.field, key=lambda f: f.number) if self.normalize else list(m.field)
        members: list[str] = []
        for f in fields:
            oneof = _real_oneof(f)
            group = [g for g in fields if oneof is not None and _real_oneof(g) == oneof] or [f]
            if group[0] is not f:
                continue  # a oneof is written where its first field is
            synthetic = [index[g.type_name] for g in group if index.get(g.type_name) in owned]
            members += messages_before(max(synthetic) + 1) if synthetic else []
            if oneof is None:
                members += self.field(f, full, nested, in_oneof=False)
            else:
                decl = m.oneof_decl[oneof]
                body = [ln for g in group for ln in self.field(g, full, nested, in_oneof=True)]
                members += _block(f"oneof {decl.name} {{",
                                  [[f"option {o};" for o in self.options(decl.options)], body])
        rest: list[str] = []
        for i, n in enumerate(nested):
            if i not in done and i not in owned:
                rest += self.message(n, full)
        for e in m.enum_type:
            rest += self.enum(e)
        reserved = [f"reserved {_range(r.start, r.end - 1, _MAX_FIELD_NUMBER)};" for r in m.reserved_range]
        reserved += [f"reserved {_quote(n)};" for n in m.reserved_name]
        extensions = [f"extensions {_range(r.start, r.end - 1, _MAX_FIELD_NUMBER)}{self.bracketed(r.options)};"
                      for r in m.extension_range]
        options = [f"option {o};" for o in self.options(m.options, skip=("map_entry",))]
        return _block(header or f"message {m.name} {{",
                      [reserved, options, members, extensions, self.extends(m.extension, full), rest])

    def field(self, f: FieldProto, scope: str, nested: Sequence[MessageProto], in_oneof: bool) -> list[str]:
        extra: list[str] = []
        if f.HasField("default_value"):
            extra.append(f"default = {self.default(f)}")
        if f.HasField("json_name") and f.json_name != default_json_name(f.name):
            extra.append(f"json_name = {_quote(f.json_name)}")
        options = self.bracketed(f.options, extra)
        entry = next((n for n in nested if f.type_name == f".{scope}.{n.name}"), None)
        if entry is not None and entry.options.map_entry and f.label == FieldProto.LABEL_REPEATED:
            kv = {g.number: g for g in entry.field}
            return [f"map<{self.type_of(kv[1])}, {self.type_of(kv[2])}> {f.name} = {f.number}{options};"]
        label = "" if in_oneof else self.label(f)
        if f.type == FieldProto.TYPE_GROUP and entry is not None:
            return self.message(entry, scope, f"{label}group {entry.name} = {f.number}{options} {{")
        return [f"{label}{self.type_of(f)} {f.name} = {f.number}{options};"]

    def label(self, f: FieldProto) -> str:
        if f.proto3_optional:
            return "optional "
        if f.label == FieldProto.LABEL_REPEATED:
            return "repeated "
        if self.implicit_labels:
            return ""
        return "required " if f.label == FieldProto.LABEL_REQUIRED else "optional "

    @staticmethod
    def type_of(f: FieldProto) -> str:
        if f.type in _NAMED or (not f.HasField("type") and f.type_name):
            return f.type_name
        return FieldProto.Type.Name(f.type).removeprefix("TYPE_").lower()

    @staticmethod
    def default(f: FieldProto) -> str:
        if f.type == FieldProto.TYPE_STRING:
            return _quote(f.default_value)  # stored as is
        if f.type == FieldProto.TYPE_BYTES:
            return f'"{f.default_value}"'  # stored C-escaped already
        return f.default_value  # numbers (inf, nan too), true/false, an enum value's name

    def extends(self, fields: Sequence[FieldProto], scope: str = "") -> list[str]:
        by_extendee: dict[str, list[str]] = {}
        for f in fields:
            by_extendee.setdefault(f.extendee, []).extend(self.field(f, scope, (), in_oneof=False))
        out: list[str] = []
        for extendee, lines in by_extendee.items():
            out += _block(f"extend {extendee} {{", [lines])
        return out

    # ---- enums and services ----

    def enum(self, e: descriptor_pb2.EnumDescriptorProto) -> list[str]:
        reserved = [f"reserved {_range(r.start, r.end, _MAX_ENUM_NUMBER)};" for r in e.reserved_range]
        reserved += [f"reserved {_quote(n)};" for n in e.reserved_name]
        # aliases keep their order: the first one names the number in option values
        values = sorted(e.value, key=lambda v: v.number) if self.normalize else list(e.value)
        body = [f"{v.name} = {v.number}{self.bracketed(v.options)};" for v in values]
        return _block(f"enum {e.name} {{", [reserved, [f"option {o};" for o in self.options(e.options)], body])

    def service(self, s: descriptor_pb2.ServiceDescriptorProto) -> list[str]:
        rpcs: list[str] = []
        for r in s.method:
            head = (f"rpc {r.name} ({'stream ' if r.client_streaming else ''}{r.input_type}) returns "
                    f"({'stream ' if r.server_streaming else ''}{r.output_type})")
            options = self.options(r.options)
            rpcs += _block(head + " {", [[f"option {o};" for o in options]]) if options else [head + ";"]
        return _block(f"service {s.name} {{", [[f"option {o};" for o in self.options(s.options)], rpcs])

    # ---- options ----

    def bracketed(self, options: Message, extra: Sequence[str] = ()) -> str:
        found = [*extra, *self.options(options)]
        return f" [{', '.join(found)}]" if found else ""

    def options(self, options: Message, skip: Sequence[str] = ()) -> list[str]:
        """``name = value`` for every option set, custom ones as ``(full.name)``."""
        if not options.ByteSize():
            return []
        msg: Message = options
        if self.pool is not None:  # read again with the classes of a pool that knows the custom options
            cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(options.DESCRIPTOR.full_name))
            msg = cls.FromString(options.SerializeToString())
        if len(unknown_fields.UnknownFieldSet(msg)):
            raise ValueError(f"a custom option of {options.DESCRIPTOR.name} whose definition is not imported")
        out: list[str] = []
        for fd, value in msg.ListFields():
            if fd.name in skip and not fd.is_extension:
                continue
            name = f"({fd.full_name})" if fd.is_extension else fd.name
            out += [f"{name} = {self.value(fd, v)}" for v in (value if fd.is_repeated else [value])]
        return out

    def value(self, fd: FieldDescriptor, v: Any) -> str:
        if fd.message_type is not None:
            inner = text_format.MessageToString(v, as_one_line=True, descriptor_pool=self.pool)
            return f"{{ {inner} }}" if inner else "{}"
        if fd.type == FieldDescriptor.TYPE_STRING:
            return _quote(v)
        if fd.type == FieldDescriptor.TYPE_BYTES:
            return '"' + text_encoding.CEscape(v, as_utf8=False) + '"'
        if fd.type == FieldDescriptor.TYPE_BOOL:
            return "true" if v else "false"
        if fd.type == FieldDescriptor.TYPE_ENUM:
            known = fd.enum_type.values_by_number.get(v) if fd.enum_type is not None else None
            return known.name if known is not None else str(v)
        return _number(v)


def render(fdp: FDP, pool: descriptor_pool.DescriptorPool | None = None, normalize: bool = False) -> str:
    """The ``.proto`` text of ``fdp``; ``pool`` (holding the file and its imports) reads its custom options.
    ``normalize``: fields and enum values in number order, imports sorted. Raises ValueError for an option it
    cannot read."""
    return _Renderer(fdp, pool, normalize).file()
