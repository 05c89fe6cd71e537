"""The control topic's messages as bytes: commit requests, commit answers (their files included) and announcements.

JSON, never pickle: anyone who can write to the control topic can put any bytes there, and decoding must not run
their code; a record that is not a message of this version raises :class:`ControlMessageError` (the consumer logs,
counts and skips it). Every message is one JSON object (ASCII) with ``"v"`` (:data:`VERSION`; a newer one is refused
with :class:`UnsupportedVersionError`: fields may be added within a version, anything else bumps it) and ``"type"``:

- ``"request"``: a :class:`~coordinator.contract.CommitRequest`, offsets as ``[partition, offset, leader epoch,
  dead-letter offset]`` lists;
- ``"response"``: a :class:`~coordinator.contract.CommitResponse`; one too big for a record (:func:`encode_response`'s
  ``max_bytes``) goes as several, each with a ``"part"`` (id, index, count) and a share of the files, which
  :func:`join_parts` puts back together;
- ``"announcement"``: an :class:`Announcement` (which instance runs which partitions' workers and coordinators,
  each partition's lag and, from the coordinator's instance, the table's last commit; ``"lag"`` and
  ``"last_commit"`` were added within version 1: an announcement without them decodes with none).

A data file is an object of its pyiceberg ``DataFile`` fields by name, for the format version whose field layout it
has (``"fv"``), bytes in base64, maps keyed by field id, plus the spec id :func:`~coordinator.contract.set_file_spec_id`
set. Each partition value goes with its Iceberg type, ``[type, base64 of pyiceberg.conversions.to_bytes]`` (null for
a null value): the partition field's type when the encoder knows the file's partition type, else the type of the
Python value (pyiceberg's internal representation: long, double, string, binary, boolean, decimal), so decoding
needs nothing but the message.
"""

from __future__ import annotations

import base64
import functools
import json
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from decimal import Decimal
from typing import Any, ClassVar, cast

from pydantic import TypeAdapter
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.manifest import DATA_FILE_TYPE, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    UUIDType,
)

from coordinator.contract import (
    ChangeMode,
    CommitCode,
    CommitRequest,
    CommitResponse,
    DataFile,
    PartitionOffset,
    file_spec_id,
    set_file_spec_id,
)

VERSION = 1
"""The message version this code writes and the newest it reads."""

DEFAULT_MAX_PART_BYTES = 512 * 1024
"""An answer larger than this (uncompressed JSON) is split: well under a cluster's default 1 MB record limit, which
Kafka's producer checks on the uncompressed size too."""

# (file list of a CommitResponse, in the order their entries are packed into parts)
_FILE_LISTS = ("data_files", "delete_files", "dead_letter_files", "change_files")
# a DataFile's field count → the table format version whose DATA_FILE_TYPE has that layout
_FORMAT_VERSIONS = {len(struct.fields): version for version, struct in DATA_FILE_TYPE.items()}
_SEPARATORS = (",", ":")


class ControlMessageError(ValueError):
    """A control-topic record that is no message this instance can use; ``reason`` names the kind for counting."""

    reason: ClassVar[str] = "malformed"


class MalformedMessageError(ControlMessageError):
    """Not a well-formed message (not JSON, a field missing or of the wrong type, an unknown kind or code)."""


class UnsupportedVersionError(ControlMessageError):
    """A message of a newer version than this instance reads (an instance of a newer release wrote it)."""

    reason = "newer-version"


@dataclass(frozen=True, slots=True)
class LastCommit:
    """A table's last committed round as its coordinator saw it: when (the snapshot's time, ms since the epoch),
    how many records it added, its snapshot id and the table's name."""

    time_ms: int
    records: int
    snapshot_id: int | None
    table: str


@dataclass(frozen=True, slots=True)
class Announcement:
    """An instance's claim, re-sent every few seconds: it runs the workers of ``partitions`` of ``topic`` (and the
    topic's coordinator when ``coordinator``). No partitions and no coordinator withdraws the claim.

    ``lag``: partition → the remote high watermark minus the table's committed offset, as this instance last saw
    them (-1: unknown); ``last_commit``: from the coordinator's instance, the table's last commit (None: unknown)."""

    instance_id: str
    topic: str
    partitions: tuple[int, ...]
    coordinator: bool
    sent_ms: int
    lag: Mapping[int, int] = dataclass_field(default_factory=dict)
    last_commit: LastCommit | None = None

    def lag_of(self, partition: int) -> int:
        """The lag announced for ``partition``, -1 when none was."""
        return self.lag.get(partition, -1)


@dataclass(frozen=True, slots=True)
class ResponsePart:
    """One of the ``count`` records an answer was split into: the answer's fields with a share of its files."""

    part_id: str  # the same for every part of one answer
    index: int
    count: int
    response: CommitResponse


Message = CommitRequest | CommitResponse | ResponsePart | Announcement
PartitionTypeOf = Callable[[DataFile], StructType | None]
"""The partition type of a data file (by its spec id), None when unknown: then values carry their Python type's."""


def partition_type_in(table: Table, data_file: DataFile) -> StructType | None:
    """The partition type of ``data_file``'s spec (:func:`~coordinator.contract.file_spec_id`) in ``table``, None
    when the file has no spec id or the table does not know it (or no longer has its source columns)."""
    spec_id = file_spec_id(data_file)
    spec = None if spec_id is None else table.specs().get(spec_id)
    if spec is None:
        return None
    try:
        return spec.partition_type(table.schema())
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------ reading JSON


class _Obj:
    """A JSON object being decoded: typed getters raising :class:`MalformedMessageError` that name the field."""

    _MISSING: ClassVar[object] = object()

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise MalformedMessageError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        self.raw: dict[str, object] = raw
        self.where = where

    def _get(self, key: str, default: object) -> object:
        value = self.raw.get(key, default)
        if value is _Obj._MISSING:
            raise MalformedMessageError(f"{self.where}: field {key!r} is missing")
        return value

    def _bad(self, key: str, expected: str, value: object) -> MalformedMessageError:
        return MalformedMessageError(f"{self.where}: field {key!r} must be {expected}, got {value!r:.80}")

    def get_int(self, key: str, default: object = _MISSING) -> int:
        value = self._get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "an integer", value)
        return value

    def get_opt_int(self, key: str) -> int | None:
        return None if self.raw.get(key) is None else self.get_int(key)

    def get_str(self, key: str, default: object = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def get_opt_str(self, key: str) -> str | None:
        return None if self.raw.get(key) is None else self.get_str(key)

    def get_bool(self, key: str, default: object = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def get_list(self, key: str, default: object = _MISSING) -> list[object]:
        value = self._get(key, default)
        if not isinstance(value, list):
            raise self._bad(key, "a list", value)
        return value

    def get_obj(self, key: str, default: object = _MISSING) -> _Obj:
        return _Obj(self._get(key, default), f"{self.where}.{key}")


def _ints(values: object, where: str) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise MalformedMessageError(f"{where}: expected a list of integers, got {values!r:.80}")
    return values


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedMessageError(f"{where}: expected base64 text, got {value!r:.80}")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise MalformedMessageError(f"{where}: not base64: {exc}") from None


# ------------------------------------------------------------------------------------------------ partition values


@functools.lru_cache(maxsize=256)
def _primitive(text: str) -> PrimitiveType:
    try:
        typ = TypeAdapter(IcebergType).validate_python(text)
    except ValueError:
        raise MalformedMessageError(f"partition value: unknown Iceberg type {text!r:.80}") from None
    if not isinstance(typ, PrimitiveType):
        raise MalformedMessageError(f"partition value: {text!r:.80} is not a primitive Iceberg type")
    return typ


def _value_type(value: object) -> PrimitiveType:
    """The Iceberg type whose internal representation ``value``'s Python type is."""
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, str):
        return StringType()
    if isinstance(value, bytes):
        return BinaryType()
    if isinstance(value, uuid.UUID):
        return UUIDType()
    if isinstance(value, Decimal) and value.is_finite():
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)  # finite
        return DecimalType(38, max(0, -exponent))
    raise TypeError(f"a partition value of type {type(value).__name__} ({value!r:.80}) cannot be encoded")


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and (a == b or a != a)  # noqa: PLR0124  (NaN == NaN here)


def _encode_value(value: Any, field_type: IcebergType | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(field_type, PrimitiveType):
        try:  # the field's own type, if the value reads back exactly as it is
            raw = to_bytes(field_type, value)
            if _same(from_bytes(field_type, raw), value):
                return [str(field_type), _b64(raw)]
        except (ValueError, TypeError, OverflowError, AttributeError, ArithmeticError, struct.error):
            pass
    typ = _value_type(value)
    if isinstance(value, Decimal) and value.as_tuple().exponent > 0:  # type: ignore[operator]
        value = value.quantize(Decimal(1))  # 1E+2 → 100: the same number, at scale 0
    try:
        return [str(typ), _b64(to_bytes(typ, value))]
    except (ValueError, OverflowError, ArithmeticError, struct.error) as exc:  # say, an int beyond a long
        raise TypeError(f"partition value {value!r:.80} cannot be encoded as {typ}: {exc}") from exc


def _encode_partition(record: Record, partition_type: StructType | None) -> list[list[str] | None]:
    values = [record[i] for i in range(len(record))]
    types: list[IcebergType | None] = [None] * len(values)
    if partition_type is not None and len(partition_type.fields) == len(values):
        types = [f.field_type for f in partition_type.fields]
    return [_encode_value(v, t) for v, t in zip(values, types, strict=True)]


def _decode_partition(raw: object, where: str) -> Record:
    if not isinstance(raw, list):
        raise MalformedMessageError(f"{where}: expected a list of partition values, got {raw!r:.80}")
    values: list[object] = []
    for i, entry in enumerate(raw):
        if entry is None:
            values.append(None)
            continue
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise MalformedMessageError(f"{where}[{i}]: expected [type, base64 value], got {entry!r:.80}")
        typ = _primitive(entry[0])
        try:
            values.append(from_bytes(typ, _unb64(entry[1], f"{where}[{i}]")))
        except ControlMessageError:
            raise
        except Exception as exc:  # struct.error, a bad UTF-8 string, a bad length...
            raise MalformedMessageError(f"{where}[{i}]: not a {typ} value: {exc}") from None
    return Record(*values)


# ------------------------------------------------------------------------------------------------ data files


def _encode_field(field: NestedField, value: Any) -> Any:
    """A DataFile field's value as JSON, by its declared type (the partition and enums are done by the caller)."""
    if value is None:
        return None
    typ = field.field_type
    if isinstance(typ, BinaryType):
        return _b64(value)
    if isinstance(typ, MapType):
        if isinstance(typ.value_type, BinaryType):
            return {str(k): _b64(v) for k, v in value.items()}
        return {str(k): int(v) for k, v in value.items()}
    if isinstance(typ, ListType):
        return [int(v) for v in value]
    if isinstance(typ, IntegerType | LongType):
        return int(value)
    return str(value)


def encode_data_file(data_file: DataFile, partition_type: StructType | None = None) -> dict[str, Any]:
    """``data_file`` as a JSON object (every field of its format version's layout, and its spec id if set)."""
    version = _FORMAT_VERSIONS.get(len(data_file))
    if version is None:
        raise TypeError(f"a DataFile of {len(data_file)} fields matches no table format version")
    out: dict[str, Any] = {"fv": version}
    for pos, field in enumerate(DATA_FILE_TYPE[version].fields):
        value = data_file[pos]
        if field.name == "partition":
            out["partition"] = _encode_partition(value, partition_type)
        elif field.name == "content":
            out["content"] = int(value)
        elif field.name == "file_format":
            out["file_format"] = FileFormat(value).value
        else:
            out[field.name] = _encode_field(field, value)
    spec_id = file_spec_id(data_file)
    if spec_id is not None:
        out["spec_id"] = spec_id
    return out


def _map_key(key: str, where: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise MalformedMessageError(f"{where}: map key {key!r:.40} is not a field id") from None


def _decode_field(obj: _Obj, field: NestedField) -> Any:
    """The inverse of :func:`_encode_field`, checking the JSON types."""
    where = f"{obj.where}.{field.name}"
    raw = obj.raw.get(field.name)
    if raw is None:
        if field.required:
            raise MalformedMessageError(f"{where}: required field is missing")
        return None
    typ = field.field_type
    if isinstance(typ, BinaryType):
        return _unb64(raw, where)
    if isinstance(typ, MapType):
        entries = obj.get_obj(field.name)
        if isinstance(typ.value_type, BinaryType):
            return {_map_key(k, where): _unb64(v, f"{where}.{k}") for k, v in entries.raw.items()}
        return {_map_key(k, where): entries.get_int(k) for k in entries.raw}
    if isinstance(typ, ListType):
        return _ints(raw, where)
    if isinstance(typ, IntegerType | LongType):
        return obj.get_int(field.name)
    return obj.get_str(field.name)


def _enum_value(make: Callable[[Any], Any], value: object, where: str) -> Any:
    try:
        return make(value)
    except ValueError:
        raise MalformedMessageError(f"{where}: unknown value {value!r:.40}") from None


def decode_data_file(raw: object, where: str = "data file") -> DataFile:
    """The ``DataFile`` :func:`encode_data_file` encoded (spec id included)."""
    obj = _Obj(raw, where)
    version = obj.get_int("fv")
    if version not in DATA_FILE_TYPE:
        raise MalformedMessageError(f"{where}: unknown table format version {version}")
    args: dict[str, Any] = {}
    for field in DATA_FILE_TYPE[version].fields:
        if field.name == "partition":
            args["partition"] = _decode_partition(obj.raw.get("partition"), f"{where}.partition")
        elif field.name == "content":
            args["content"] = _enum_value(DataFileContent, obj.get_int("content"), f"{where}.content")
        elif field.name == "file_format":
            args["file_format"] = _enum_value(FileFormat, obj.get_str("file_format"), f"{where}.file_format")
        else:
            args[field.name] = _decode_field(obj, field)
    data_file = DataFile.from_args(_table_format_version=cast(TableVersion, version), **args)
    spec_id = obj.get_opt_int("spec_id")
    if spec_id is not None:
        set_file_spec_id(data_file, spec_id)
    return data_file


# ------------------------------------------------------------------------------------------------ messages


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=_SEPARATORS, allow_nan=False)


def encode_request(request: CommitRequest) -> bytes:
    """A commit request as one record value."""
    mode = request.change_mode
    return _dumps({
        "v": VERSION, "type": "request", "commit_id": request.commit_id, "topic": request.topic,
        "spec_id": request.spec_id, "schema_id": request.schema_id,
        "offsets": [[o.partition, o.offset, o.leader_epoch, o.dead_letter_offset] for o in request.offsets],
        "sent_ms": request.sent_ms,
        "change_mode": None if mode is None else {"keys": list(mode.keys), "cdc_field": mode.cdc_field,
                                                  "upsert": mode.upsert},
    }).encode("ascii")


def _decode_request(obj: _Obj) -> CommitRequest:
    offsets = []
    for i, entry in enumerate(obj.get_list("offsets")):
        values = _ints(entry, f"{obj.where}.offsets[{i}]")
        if len(values) != 4:
            raise MalformedMessageError(f"{obj.where}.offsets[{i}]: expected [partition, offset, leader epoch, "
                                        f"dead-letter offset], got {values!r:.80}")
        offsets.append(PartitionOffset(*values))
    mode = None
    if obj.raw.get("change_mode") is not None:
        m = obj.get_obj("change_mode")
        keys = m.get_list("keys")
        if not all(isinstance(k, str) for k in keys):
            raise MalformedMessageError(f"{m.where}.keys: expected a list of strings, got {keys!r:.80}")
        mode = ChangeMode(tuple(str(k) for k in keys), m.get_opt_str("cdc_field"), m.get_bool("upsert", False))
    return CommitRequest(commit_id=obj.get_str("commit_id"), topic=obj.get_str("topic"),
                         spec_id=obj.get_int("spec_id"), schema_id=obj.get_int("schema_id"), offsets=tuple(offsets),
                         sent_ms=obj.get_int("sent_ms", 0), change_mode=mode)


def encode_announcement(announcement: Announcement) -> bytes:
    """An announcement as one record value."""
    a, c = announcement, announcement.last_commit
    return _dumps({"v": VERSION, "type": "announcement", "instance_id": a.instance_id, "topic": a.topic,
                   "partitions": list(a.partitions), "coordinator": a.coordinator, "sent_ms": a.sent_ms,
                   "lag": [[p, n] for p, n in sorted(a.lag.items())],
                   "last_commit": None if c is None else {"time_ms": c.time_ms, "records": c.records,
                                                          "snapshot_id": c.snapshot_id, "table": c.table},
                   }).encode("ascii")


def _decode_announcement(obj: _Obj) -> Announcement:
    lag: dict[int, int] = {}
    for i, pair in enumerate(obj.get_list("lag", [])):  # absent: an announcement of an older release
        values = _ints(pair, f"{obj.where}.lag[{i}]")
        if len(values) != 2:
            raise MalformedMessageError(f"{obj.where}.lag[{i}]: expected [partition, lag], got {values!r:.80}")
        lag[values[0]] = values[1]
    last = None
    if obj.raw.get("last_commit") is not None:
        c = obj.get_obj("last_commit")
        last = LastCommit(c.get_int("time_ms"), c.get_int("records"), c.get_opt_int("snapshot_id"),
                          c.get_str("table"))
    return Announcement(obj.get_str("instance_id"), obj.get_str("topic"),
                        tuple(_ints(obj.get_list("partitions"), f"{obj.where}.partitions")),
                        obj.get_bool("coordinator"), obj.get_int("sent_ms"), lag, last)


def _response_head(r: CommitResponse) -> dict[str, Any]:
    """Everything of an answer but its files."""
    return {"v": VERSION, "type": "response", "code": int(r.code), "commit_id": r.commit_id, "topic": r.topic,
            "partition": r.partition, "leader_epoch": r.leader_epoch, "start_offset": r.start_offset,
            "next_offset": r.next_offset, "record_count": r.record_count, "byte_count": r.byte_count,
            "field_count": r.field_count, "watermark": r.watermark, "skipped": dict(r.skipped), "error": r.error,
            "waiting": r.waiting, "table_change": r.table_change}


def _assemble(head: dict[str, Any], lists: dict[str, list[str]]) -> bytes:
    """``head`` plus the file lists, whose entries are JSON already (each encoded once, also to measure it)."""
    text = _dumps(head)[:-1] + "".join(f',"{name}":[{",".join(items)}]' for name, items in lists.items()) + "}"
    return text.encode("ascii")


def _pack(lists: dict[str, list[str]], budget: int) -> Iterator[dict[str, list[str]]]:
    """The file entries in order, in shares of at most ``budget`` characters (at least one entry each)."""
    share: dict[str, list[str]] = {name: [] for name in lists}
    size = count = 0
    for name, items in lists.items():
        for item in items:
            if count and size + len(item) + 1 > budget:
                yield share
                share, size, count = {n: [] for n in lists}, 0, 0
            share[name].append(item)
            size, count = size + len(item) + 1, count + 1
    yield share


def encode_response(response: CommitResponse, *, max_bytes: int = DEFAULT_MAX_PART_BYTES,
                    partition_type: PartitionTypeOf | None = None) -> list[bytes]:
    """An answer as record values: one, or several parts of at most about ``max_bytes`` each when its files need
    more (a part holds at least one file, so a single file larger than that still makes a larger record).

    ``partition_type`` gives each file's partition type, so its values go with their fields' types.
    """
    head = _response_head(response)

    def entry(data_file: DataFile) -> str:
        return _dumps(encode_data_file(data_file, partition_type(data_file) if partition_type else None))

    lists = {name: [entry(f) for f in getattr(response, name)] for name in _FILE_LISTS}
    whole = _assemble(head, lists)
    if len(whole) <= max_bytes:
        return [whole]
    overhead = len(_dumps(head)) + 200  # the part marker and the lists' names
    shares = list(_pack(lists, max(1, max_bytes - overhead)))
    if len(shares) == 1:  # no files to share out (or just one): as it is
        return [whole]
    part_id = str(uuid.uuid4())
    return [_assemble({**head, "part": {"id": part_id, "index": i, "count": len(shares)}}, share)
            for i, share in enumerate(shares)]


def _files(obj: _Obj, name: str) -> tuple[DataFile, ...]:
    return tuple(decode_data_file(raw, f"{obj.where}.{name}[{i}]")
                 for i, raw in enumerate(obj.get_list(name, [])))


def _decode_response(obj: _Obj) -> CommitResponse | ResponsePart:
    skipped = obj.get_obj("skipped", {})
    response = CommitResponse(
        code=_enum_value(CommitCode, obj.get_int("code"), f"{obj.where}.code"),
        commit_id=obj.get_str("commit_id"), topic=obj.get_str("topic"), partition=obj.get_int("partition"),
        leader_epoch=obj.get_int("leader_epoch"), start_offset=obj.get_int("start_offset"),
        next_offset=obj.get_int("next_offset"), data_files=_files(obj, "data_files"),
        delete_files=_files(obj, "delete_files"), dead_letter_files=_files(obj, "dead_letter_files"),
        record_count=obj.get_int("record_count", 0), byte_count=obj.get_int("byte_count", 0),
        field_count=obj.get_int("field_count", 0), watermark=obj.get_int("watermark", -1),
        skipped={k: skipped.get_int(k) for k in skipped.raw}, error=obj.get_opt_str("error"),
        waiting=obj.get_opt_str("waiting"), table_change=obj.get_opt_str("table_change"),
        change_files=_files(obj, "change_files"),
    )
    if obj.raw.get("part") is None:
        return response
    part = obj.get_obj("part")
    index, count = part.get_int("index"), part.get_int("count")
    if not 0 <= index < count:
        raise MalformedMessageError(f"{part.where}: part {index} of {count}")
    return ResponsePart(part.get_str("id"), index, count, response)


def join_parts(parts: Sequence[ResponsePart]) -> CommitResponse:
    """The answer split into ``parts`` (any order; all of them, of one answer)."""
    ordered = sorted(parts, key=lambda p: p.index)
    if not ordered or [p.index for p in ordered] != list(range(ordered[0].count)) \
            or any(p.part_id != ordered[0].part_id or p.count != ordered[0].count for p in ordered):
        raise MalformedMessageError(f"the parts of an answer do not fit together: "
                                    f"{[(p.part_id, p.index, p.count) for p in ordered]!r:.200}")
    def joined(name: str) -> tuple[DataFile, ...]:
        return tuple(f for p in ordered for f in getattr(p.response, name))

    return replace(ordered[0].response, data_files=joined("data_files"), delete_files=joined("delete_files"),
                   dead_letter_files=joined("dead_letter_files"), change_files=joined("change_files"))


_DECODERS: dict[str, Callable[[_Obj], Message]] = {
    "request": _decode_request,
    "response": _decode_response,
    "announcement": _decode_announcement,
}


def decode(data: bytes) -> Message:
    """The message in a record value; raises :class:`UnsupportedVersionError` for a newer version and
    :class:`MalformedMessageError` for anything else that is not a message."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
        raise MalformedMessageError(f"not a control message (no JSON: {exc})") from None
    obj = _Obj(raw, "control message")
    version = obj.get_int("v")
    if version > VERSION:
        raise UnsupportedVersionError(f"control message of version {version}, newer than this instance reads "
                                      f"({VERSION}): upgrade every tabletopic attach instance to the same release")
    if version < 1:
        raise MalformedMessageError(f"control message of version {version}")
    kind = obj.get_str("type")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedMessageError(f"control message of unknown type {kind!r:.40}")
    obj.where = f"{kind} message"
    try:
        return decoder(obj)
    except ControlMessageError:
        raise
    except Exception as exc:  # a value the message classes refuse: still just a bad record
        raise MalformedMessageError(f"{kind} message: {type(exc).__name__}: {exc}") from None


__all__ = [
    "DEFAULT_MAX_PART_BYTES",
    "VERSION",
    "Announcement",
    "ControlMessageError",
    "LastCommit",
    "MalformedMessageError",
    "Message",
    "PartitionTypeOf",
    "ResponsePart",
    "UnsupportedVersionError",
    "decode",
    "decode_data_file",
    "encode_announcement",
    "encode_data_file",
    "encode_request",
    "encode_response",
    "join_parts",
    "partition_type_in",
]
