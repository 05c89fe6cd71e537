"""The schema registry without HTTP: Avro compatibility levels, the ``_schemas`` records and their replay, and the
service's rules on a real log (ids, versions, deletes, references, modes) across reopening the log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from configs.errors import InvalidConfigError
from configs.model import BrokerConfig
from tabletopic.log.manager import LogManager
from tabletopic.protocol.records import validate_produce_records
from tabletopic.registry.avro_format import AvroFormat
from tabletopic.registry.compat import Level, incompatibilities, parse_level
from tabletopic.registry.errors import RegistryError
from tabletopic.registry.json_format import JsonFormat
from tabletopic.registry.protobuf_format import ProtobufFormat
from tabletopic.registry.service import RegistryService, parse_version, schema_request
from tabletopic.registry.store import TOPIC, RegistryState, SchemaStore, encode_batch
from tabletopic.topics import TopicManager

AVRO = AvroFormat()


def record(*fields: dict[str, Any], name: str = "R") -> str:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)})


V1 = record({"name": "a", "type": "int"})
V2_ADD_DEFAULT = record({"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""})
V2_ADD_REQUIRED = record({"name": "a", "type": "int"}, {"name": "b", "type": "string"})
V_LONG = record({"name": "a", "type": "long"})
V_DROP = record({"name": "b", "type": "string", "default": "x"})
V_C = record({"name": "c", "type": "int"})
V_DEFAULTS = record({"name": "a", "type": "int", "default": 0}, {"name": "b", "type": "string", "default": ""})


def incompatible(level: str, new: str, *old: str) -> bool:
    parsed = [(i + 1, AVRO.parse(o, ())) for i, o in enumerate(old)]
    return bool(incompatibilities(Level(level), AVRO.parse(new, ()), parsed))


# ---- compatibility ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("level", "new", "old", "refused"),
    [
        # a new field with a default: readable both ways
        ("BACKWARD", V2_ADD_DEFAULT, [V1], False),
        ("FORWARD", V2_ADD_DEFAULT, [V1], False),
        ("FULL", V2_ADD_DEFAULT, [V1], False),
        # a new field without a default: the new reader cannot fill it from old data
        ("BACKWARD", V2_ADD_REQUIRED, [V1], True),
        ("FORWARD", V2_ADD_REQUIRED, [V1], False),
        ("FULL", V2_ADD_REQUIRED, [V1], True),
        # int → long: the new reader promotes old ints; an old int reader cannot read longs
        ("BACKWARD", V_LONG, [V1], False),
        ("FORWARD", V_LONG, [V1], True),
        ("FULL", V_LONG, [V1], True),
        ("NONE", V2_ADD_REQUIRED, [V1], False),
        # transitive levels look past the latest version
        ("BACKWARD", V_DROP, [V1, V2_ADD_DEFAULT], False),
        ("BACKWARD_TRANSITIVE", V_DROP, [V1, V2_ADD_DEFAULT], False),
        ("FORWARD", V_DROP, [V2_ADD_REQUIRED, V_DEFAULTS], False),
        ("FORWARD_TRANSITIVE", V_DROP, [V2_ADD_REQUIRED, V_DEFAULTS], True),
        ("FULL", V1, [V2_ADD_REQUIRED, V2_ADD_DEFAULT], False),
        ("FULL_TRANSITIVE", V1, [V2_ADD_REQUIRED, V2_ADD_DEFAULT], True),
    ],
)
def test_avro_levels(level: str, new: str, old: list[str], refused: bool) -> None:
    assert incompatible(level, new, *old) == refused


def test_avro_rules_beyond_fields() -> None:
    enum = lambda *s: json.dumps({"type": "enum", "name": "E", "symbols": list(s)})  # noqa: E731
    assert incompatible("BACKWARD", enum("A"), enum("A", "B"))  # the reader lacks a symbol the writer has
    assert not incompatible("BACKWARD", enum("A", "B"), enum("A"))
    assert not incompatible("BACKWARD", '["null", "string"]', '"string"')  # a union reader takes its branch
    assert incompatible("BACKWARD", '"string"', '["null", "string"]')
    assert incompatible("BACKWARD", record({"name": "a", "type": "int"}, name="Other"), V1)  # renamed record
    assert not incompatible("BACKWARD", '"bytes"', '"string"')


def test_avro_parse_refuses_bad_schemas_and_checks_defaults() -> None:
    for bad in ('{"type": "nope"}', "{not json", '{"type": "record", "name": "R"}',
                record({"name": "a", "type": "int", "default": "text"}), "[" * 100_000):
        with pytest.raises(RegistryError) as ei:
            AVRO.parse(bad, ())
        assert ei.value.error_code == 42201
    # named types from references resolve; the stored text keeps the reference by name
    dep = json.dumps({"type": "record", "name": "Inner", "namespace": "n", "fields": [{"name": "x", "type": "int"}]})
    outer = record({"name": "i", "type": "n.Inner"})
    assert json.loads(AVRO.parse(outer, (("n.Inner", dep),)).text(False)) == json.loads(outer)
    with pytest.raises(RegistryError):
        AVRO.parse(outer, ())


def test_text_and_normalize() -> None:
    # Confluent's canonical form (Java Avro's Schema.toString): Avro's own attributes in its order, whitespace gone
    spaced = '{ "name": "R", "type": "record",\n "fields": [ {"type": "int", "name": "a"} ] }'
    assert AVRO.parse(spaced, ()).text(False) == '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
    assert AVRO.parse(spaced, ()).text(True) == AVRO.parse(V1, ()).text(True)


def test_levels_and_versions_parse_like_confluent() -> None:
    assert parse_level("full_transitive") is Level.FULL_TRANSITIVE
    for bad in ("SIDEWAYS", None, 3):
        with pytest.raises(RegistryError) as ei:
            parse_level(bad)
        assert ei.value.error_code == 42203
    assert parse_version("latest") is None and parse_version("-1") is None and parse_version("7") == 7
    for bad in ("0", "-2", "x", "2147483648"):
        with pytest.raises(RegistryError) as ei:
            parse_version(bad)
        assert ei.value.error_code == 42202


# ---- records and replay -----------------------------------------------------------------------------------------

def test_state_applies_every_record_kind() -> None:
    st = RegistryState()
    value = {"subject": "s", "version": 1, "id": 7, "schemaType": "AVRO", "schema": V1, "references": []}
    st.apply({"keytype": "SCHEMA", "subject": "s", "version": 1}, value)
    st.apply({"keytype": "SCHEMA", "subject": "s", "version": 2}, {**value, "version": 2, "id": 8})
    st.apply({"keytype": "DELETE_SUBJECT", "subject": "s"}, {"subject": "s", "version": 1})
    assert [v.deleted for v in st.versions("s", deleted=True)] == [True, False]
    st.apply({"keytype": "CLEAR_SUBJECT", "subject": "s"}, {"subject": "s", "version": 2})
    assert "s" not in st.subjects and st.high_id == 8 and not st.holders(7, deleted=True)
    st.apply({"keytype": "ID_HIGH"}, {"id": 20})
    st.apply({"keytype": "CONFIG", "subject": None}, {"compatibilityLevel": "FULL"})
    st.apply({"keytype": "MODE", "subject": "s"}, {"mode": "READONLY"})
    st.apply({"keytype": "MODE", "subject": "s"}, None)
    assert (st.high_id, st.config, st.mode) == (20, {None: "FULL"}, {})
    for key, value in (({"keytype": "SOMETHING"}, {}), ({"keytype": "CONFIG"}, {"compatibilityLevel": "SIDEWAYS"}),
                       ({"keytype": "MODE"}, {"mode": "ANY"})):
        with pytest.raises(ValueError):
            st.apply(key, value)


# ---- the service on a real log ----------------------------------------------------------------------------------

@asynccontextmanager
async def opened(data: Path) -> AsyncIterator[RegistryService]:
    cfg = BrokerConfig.from_properties({"log.dirs": str(data)})
    logs = LogManager(cfg.log_dir)
    await logs.start()
    topics = TopicManager(cfg, logs)
    topics.load()
    store = SchemaStore(topics, logs)
    service = RegistryService(store)
    try:
        await store.start()
        yield service
    finally:
        service.close()
        await logs.close()


def run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def req(schema: str, **extra: Any) -> Any:
    return schema_request({"schema": schema, **extra})


async def refused(code: int, aw: Awaitable[Any]) -> RegistryError:
    with pytest.raises(RegistryError) as ei:
        await aw
    assert ei.value.error_code == code, ei.value.message
    return ei.value


def test_ids_versions_and_deletes_survive_reopening(tmp_path: Path) -> None:
    async def first() -> None:
        async with opened(tmp_path) as svc:
            a1 = await svc.register("a", req(V1))
            assert (a1.id, a1.version) == (1, 1)
            assert await svc.register("a", req(V1)) == a1  # same schema, same version
            b1 = await svc.register("b", req(V1))
            assert (b1.id, b1.version) == (1, 1)  # same schema elsewhere: same id
            a2 = await svc.register("a", req(V2_ADD_DEFAULT))
            assert (a2.id, a2.version) == (2, 2)
            await refused(40901, svc.register("a", req(V_C)))
            gone = await svc.register("gone", req(V_DROP))
            assert gone.id == 3
            assert await svc.delete_subject("gone") == [1]
            assert await svc.delete_subject("gone", permanent=True) == [1]
            assert await svc.delete_version("a", "1") == 1

    async def second() -> None:
        async with opened(tmp_path) as svc:
            assert svc.subjects() == ["a", "b"]
            assert [v.version for v in svc.versions("a")] == [2]
            assert [v.version for v in svc.versions("a", deleted=True)] == [1, 2]
            assert svc.schema(1).schema == json.dumps(json.loads(V1), separators=(",", ":"))
            await refused(40403, _raise(lambda: svc.schema(3)))
            # the id of a permanently deleted schema is not given to another one
            new = await svc.register("c", req(V_LONG))
            assert new.id == 4
            # ... and the same schema registered again gets its old id back
            assert (await svc.register("gone", req(V_DROP))).id == 3

    run(first)
    run(second)


async def _raise(fn: Callable[[], Any]) -> Any:
    return fn()


def test_delete_rules(tmp_path: Path) -> None:
    async def go() -> None:
        async with opened(tmp_path) as svc:
            await svc.register("s", req(V1))
            await svc.register("s", req(V2_ADD_DEFAULT))
            await refused(40401, svc.delete_subject("nope"))
            await refused(40405, svc.delete_subject("s", permanent=True))
            await refused(40407, svc.delete_version("s", "1", permanent=True))
            await refused(40402, svc.delete_version("s", "9"))
            assert await svc.delete_version("s", "latest") == 2
            await refused(40406, svc.delete_version("s", "2"))
            assert await svc.delete_version("s", "2", permanent=True) == 2
            assert await svc.delete_subject("s") == [1]
            await refused(40404, svc.delete_subject("s"))
            await refused(40401, _raise(lambda: svc.versions("s")))
            assert svc.subjects(deleted=True) == ["s"] and svc.subjects(deleted_only=True) == ["s"]
            # after a soft delete the next version continues the numbering
            assert (await svc.register("s", req(V1))).version == 2

    run(go)


def test_references_config_and_modes(tmp_path: Path) -> None:
    inner = json.dumps({"type": "record", "name": "Inner", "namespace": "n", "fields": [{"name": "x", "type": "int"}]})
    outer = record({"name": "i", "type": "n.Inner"})

    async def go() -> None:
        async with opened(tmp_path) as svc:
            i1 = await svc.register("inner", req(inner))
            ref = [{"name": "n.Inner", "subject": "inner", "version": 1}]
            o1 = await svc.register("outer", req(outer, references=ref))
            assert svc.referenced_by("inner", "1") == [o1.id]
            await refused(42206, svc.delete_subject("inner"))
            await refused(42201, svc.register("x", req(outer)))  # the named type needs the reference
            await refused(42201, svc.register("x", req(outer, references=[{**ref[0], "version": 5}])))
            assert svc.schema(o1.id).references[0].subject == "inner" and i1.id != o1.id
            # config: subject level over global over the default
            assert svc.config(None) == "BACKWARD"
            await refused(40408, _raise(lambda: svc.config("outer")))
            await svc.set_config("s", Level.NONE)
            await svc.register("s", req(V1))
            assert (await svc.register("s", req(V2_ADD_REQUIRED))).version == 2  # NONE lets it through
            assert await svc.delete_config("s") == "NONE"
            # modes
            await svc.set_mode("s", "READONLY")
            await refused(42205, svc.register("s", req(V_LONG)))
            await refused(42205, svc.delete_subject("s"))
            assert await svc.delete_mode("s") == "READONLY"
            await refused(42204, svc.set_mode(None, "SIDEWAYS"))
            await refused(42205, svc.set_mode(None, "IMPORT"))  # subjects exist
            await refused(42205, svc.register("s", req(V_LONG, id=100)))  # ids only in IMPORT mode
            await svc.set_mode("imp", "IMPORT")
            imported = await svc.register("imp", req(V_LONG, id=100, version=7))
            assert (imported.id, imported.version) == (100, 7)
            assert (await svc.register("later", req(record({"name": "z", "type": "int"})))).id == 101

    run(go)


def test_version_segments_read_as_confluents_version_id() -> None:
    assert [parse_version(s) for s in ("LATEST", " 3 ", "+3", "-1")] == [None, 3, 3, None]
    for bad, named in (("1_0", "1_0"), ("3.0", "3.0"), ("-0", "0"), ("+0", "0"), ("-05", "-5")):
        with pytest.raises(RegistryError) as ei:
            parse_version(bad)
        assert ei.value.message.startswith(f"The specified version '{named}' is not a valid version id.")


def test_accept_headers_rank_as_in_jax_rs() -> None:
    from tabletopic.registry.api import negotiate

    v1, v0, plain = "application/vnd.schemaregistry.v1+json", "application/vnd.schemaregistry+json", "application/json"
    for accept, chosen in ((None, v1), ("", v1), ("*/*", v1), ("application/*", v1), (plain, plain), (v0, v0),
                           (f"{plain}, {v0}", v0), (f"{plain}, {v1};q=0.8", plain), ("text/*, */*;q=0.2", v1),
                           (f"{plain};q=0, */*", v1), ("text/html", None), (f"{plain};q=0", None)):
        assert negotiate(accept) == chosen, accept


def test_rules_checked_in_confluents_order(tmp_path: Path) -> None:
    inner = json.dumps({"type": "record", "name": "In", "namespace": "n", "fields": [{"name": "x", "type": "int"}]})
    outer = record({"name": "i", "type": "n.In"})

    async def go() -> None:
        async with opened(tmp_path) as svc:
            await svc.register("in", req(inner))
            await svc.register("out", req(outer, references=[{"name": "n.In", "subject": "in", "version": 1}]))
            e = await refused(42206, svc.delete_version("in", "1", permanent=True))  # before 40407
            assert e.message == ("One or more references exist to the schema "
                                 "{magic=1,keytype=SCHEMA,subject=in,version=1}.")
            await svc.delete_subject("out")
            assert await svc.delete_version("in", "1") == 1  # a soft-deleted referrer lets a soft delete through
            await refused(42206, svc.delete_version("in", "1", permanent=True))  # ... not a permanent one
            await refused(42206, svc.delete_subject("in", permanent=True))
            # references within one subject do not keep it from being deleted
            await svc.set_config("self", Level.NONE)
            await svc.register("self", req(inner))
            await svc.register("self", req(outer, references=[{"name": "n.In", "subject": "self", "version": 1}]))
            assert await svc.delete_subject("self") == [1, 2]
            # IMPORT mode takes ids only; a read-only subject still answers a schema it has
            await svc.set_mode("imp", "IMPORT")
            e = await refused(42205, svc.register("imp", req(V1)))
            assert e.message == "Subject imp in context  is not in read-write mode"
            first = await svc.register("ro", req(V1))
            await svc.set_mode("ro", "READONLY")
            assert await svc.register("ro", req(V1)) == first
            e = await refused(42205, svc.register("ro", req(V_LONG)))
            assert e.message == "Subject ro in context  is in read-only mode"
            # a version given outside IMPORT mode must be the next one
            e = await refused(42201, svc.register("mix", req(V1, version=5)))
            assert e.message == "Version is not one more than previous version"
            assert (await svc.register("mix", req(V1, version=1))).version == 1
            # the level compares with a version of another schema type: incompatible, as in Confluent
            e = await refused(40901, svc.register("mix", req('{"type": "object"}', schemaType="JSON")))
            assert "[Incompatible because of different schema type, {validateFields: 'false'" in e.message
            # a mode set to nothing (PUT {}) is unset; references are resolved as part of parsing
            assert await svc.set_mode("ro", None) is None
            await refused(40409, _raise(lambda: svc.mode("ro")))
            e = await refused(42201, svc.register("x", req(outer, references=[
                {"name": "n.In", "subject": "in", "version": 9}])))
            assert e.message == ("Invalid schema of type AVRO, details: No schema reference found for subject \"in\" "
                                 "and version 9")

    run(go)


def test_malformed_records_in_the_topic_are_skipped(tmp_path: Path) -> None:
    async def go() -> None:
        async with opened(tmp_path) as svc:
            await svc.register("s", req(V1))
            plog = svc.store._log()
            buf = bytearray(encode_batch([({"keytype": "SCHEMA"}, {"no": "fields"})], 0))
            # a record that is not JSON at all, as any producer could write to the topic
            from aiokafka.record.default_records import DefaultRecordBatchBuilder
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                          producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
            b.append(0, 0, b"\xff not json", b"x", headers=[])
            for raw in (buf, b.build()):
                r = plog.append(raw, validate_produce_records(raw), 0)
                await plog.wait_durable(r.last_offset)
        async with opened(tmp_path) as svc:
            assert [v.version for v in svc.versions("s")] == [1]
            assert svc.store._topics.get(TOPIC) is not None

    run(go)


# ---- JSON Schema --------------------------------------------------------------------------------------------------

JSON = JsonFormat()


def obj(props: dict[str, Any], *, closed: bool = False, required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


def json_reads(reader: Any, writer: Any, deps: tuple[tuple[str, str], ...] = ()) -> bool:
    """Whether ``reader`` reads everything ``writer`` accepts."""
    return not JSON.parse(json.dumps(reader), deps).can_read(JSON.parse(json.dumps(writer), deps))


INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}


@pytest.mark.parametrize(
    ("reader", "writer", "readable"),
    [
        (obj({"a": INT}), obj({"a": INT}), True),
        # a property added to the reader: the open writer may have written anything under that name
        (obj({"a": INT, "b": STR}), obj({"a": INT}), False),
        (obj({"a": INT, "b": STR}), obj({"a": INT}, closed=True), True),
        # a property the reader dropped: fine while the reader stays open
        (obj({"a": INT}), obj({"a": INT, "b": STR}), True),
        (obj({"a": INT}, closed=True), obj({"a": INT, "b": STR}, closed=True), False),
        # types widen, never narrow
        (obj({"a": NUM}), obj({"a": INT}), True),
        (obj({"a": INT}), obj({"a": NUM}), False),
        ({"type": ["string", "null"]}, STR, True),
        (STR, {"type": ["string", "null"]}, False),
        # required: only what the writer requires too, unless the reader has a default
        (obj({"a": INT}, required=("a",)), obj({"a": INT}), False),
        (obj({"a": {**INT, "default": 0}}, required=("a",)), obj({"a": INT}), True),
        (obj({"a": INT}), obj({"a": INT}, required=("a",)), True),
        ({"enum": ["x", "y", "z"]}, {"enum": ["x", "y"]}, True),
        ({"enum": ["x"]}, {"enum": ["x", "y"]}, False),
        ({"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 10}, False),
        ({"type": "array", "items": NUM}, {"type": "array", "items": INT}, True),
        ({"type": "array", "items": INT}, {"type": "array", "items": STR}, False),
        ({"anyOf": [INT, STR]}, STR, True),
        (STR, {"oneOf": [INT, STR]}, False),
    ],
)
def test_json_schema_rules(reader: Any, writer: Any, readable: bool) -> None:
    assert json_reads(reader, writer) == readable


def test_json_schema_refs_and_invalid_schemas() -> None:
    address = json.dumps(obj({"street": STR}))
    local = {"definitions": {"n": INT}, **obj({"a": {"$ref": "#/definitions/n"}})}
    assert json_reads(local, obj({"a": INT})) and not json_reads(local, obj({"a": STR}))
    outer = obj({"ship_to": {"$ref": "address.json"}})
    assert json_reads(outer, outer, (("address.json", address),))
    tree = {"definitions": {"node": obj({"children": {"type": "array", "items": {"$ref": "#/definitions/node"}}})},
            "$ref": "#/definitions/node"}
    assert json_reads(tree, tree)  # a recursive schema compares in finite time
    for bad in ('{"type": 5}', "not json", '"text"', json.dumps(outer), '{"$ref": "#/definitions/none"}'):
        with pytest.raises(RegistryError) as ei:
            JSON.parse(bad, ())
        assert ei.value.error_code == 42201


# ---- Protobuf -----------------------------------------------------------------------------------------------------

PROTO = ProtobufFormat()


def proto(body: str, syntax: str = "proto3") -> str:
    return f'syntax = "{syntax}";\npackage shop;\n{body}\n'


ORDER = proto("message Order { int64 id = 1; string item = 2; message Line { int32 n = 1; } }")


@pytest.mark.parametrize(
    ("reader", "problem"),
    [
        (ORDER, None),
        (proto("message Order { int64 id = 1; string item = 2; int32 qty = 3; message Line { int32 n = 1; } }"),
         None),  # a field added
        (proto("message Order { int64 id = 1; message Line { int32 n = 1; } }"), None),  # a field removed
        (proto("message Order { int32 id = 1; bytes item = 2; message Line { sint32 n = 1; } }"),
         "FIELD_SCALAR_KIND_CHANGED"),  # int64→int32 and string→bytes are wire-compatible, int32→sint32 is not
        (proto("message Order { string id = 1; string item = 2; message Line { int32 n = 1; } }"),
         "FIELD_SCALAR_KIND_CHANGED"),
        (proto("message Order { int64 id = 1; repeated string item = 2; message Line { int32 n = 1; } }"),
         "FIELD_LABEL_CHANGED"),
        (proto("message Order { int64 id = 1; Line item = 2; message Line { int32 n = 1; } }"),
         "FIELD_KIND_CHANGED"),
        (proto("message Order { int64 id = 1; string item = 2; }"), "MESSAGE_REMOVED"),
        (proto("message Order { int64 id = 1; oneof pick { string item = 2; } message Line { int32 n = 1; } }"),
         None),  # one field into a new oneof
        (proto("message Order { oneof pick { int64 id = 1; string item = 2; } message Line { int32 n = 1; } }"),
         "MULTIPLE_FIELDS_MOVED_TO_ONEOF"),
        (proto("message Order { optional int64 id = 1; optional string item = 2; required int32 q = 3; "
               "message Line { optional int32 n = 1; } }", "proto2"), "REQUIRED_FIELD_ADDED"),
    ],
)
def test_protobuf_rules(reader: str, problem: str | None) -> None:
    found = PROTO.parse(reader, ()).can_read(PROTO.parse(ORDER, ()))
    assert (problem is None and not found) or (problem is not None and any(problem in f for f in found)), found


def test_protobuf_text_descriptor_imports_and_invalid() -> None:
    parsed = PROTO.parse(ORDER, ())
    assert PROTO.parse(parsed.text(False), ()).text(False) == parsed.text(False)  # base64 descriptors are taken
    money = proto("message Money { int64 cents = 1; }").replace("package shop", "package common")
    uses = 'syntax = "proto3";\nimport "common/money.proto";\nimport "google/protobuf/timestamp.proto";\n' \
           "message P { common.Money m = 1; google.protobuf.Timestamp at = 2; }"
    assert PROTO.parse(uses, (("common/money.proto", money),)).can_read(PROTO.parse(uses, (("common/money.proto",
                                                                                          money),))) == []
    for bad, deps in ((uses, ()), ("message {", ()), (proto("message A { Missing m = 1; }"), ())):
        with pytest.raises(RegistryError) as ei:
            PROTO.parse(bad, deps)
        assert ei.value.error_code == 42201 and "Traceback" not in ei.value.message


def test_protobuf_built_in_imports_without_references() -> None:
    # confluent-kafka never sends google/protobuf/*, google/type/* or confluent/* imports as references: a base64
    # descriptor importing them parses against the runtime's copies (googleapis-common-protos, confluent-kafka)
    import base64

    from google.protobuf import descriptor_pb2, timestamp_pb2

    fdp = descriptor_pb2.FileDescriptorProto(name="shop/dated.proto", package="shop", syntax="proto3",
                                             dependency=["google/type/date.proto", "confluent/meta.proto"])
    m = fdp.message_type.add(name="Dated")
    m.field.add(name="day", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                type_name=".google.type.Date", label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    PROTO.parse(base64.b64encode(fdp.SerializeToString()).decode(), ())
    # the serializer with skip.known.types=false registers the well-known files as subjects of their own
    PROTO.parse(base64.b64encode(timestamp_pb2.DESCRIPTOR.serialized_pb).decode(), ())


def test_the_listeners_setting() -> None:
    parse = lambda v: BrokerConfig.from_properties({"schema.registry.listeners": v}).schema_registry_listeners  # noqa: E731
    assert parse("") == [] and BrokerConfig.from_properties({}).schema_registry_listeners == []
    assert parse("http://127.0.0.1:8081,http://[::1]:0") == [("127.0.0.1", 8081), ("::1", 0)]
    tls = BrokerConfig.from_properties({"schema.registry.listeners": "https://0.0.0.0:8443,http://127.0.0.1:1"})
    assert tls.schema_registry_listeners == [("0.0.0.0", 8443), ("127.0.0.1", 1)]
    assert tls.schema_registry_https == [True, False]
    assert tls.converter_registry_url == "https://127.0.0.1:8443"
    for bad in ("ftp://127.0.0.1:8081", "http://127.0.0.1", "127.0.0.1:8081", "http://h:70000", "http://h:1/x"):
        with pytest.raises(InvalidConfigError, match=r"schema\.registry\.listeners"):
            parse(bad)


# ---- schema formats as Confluent's (issue 23 item 3.2, 3.3, 3.4, 3.6, 3.7) -------------------------------------

def test_avro_text_is_confluents_canonical_form() -> None:
    canonical = '{"type":"record","name":"R","namespace":"n","fields":[{"name":"a","type":"int"}]}'
    for spelling in ({"fields": [{"type": "int", "name": "a"}], "namespace": "n", "type": "record", "name": "R"},
                     {"type": "record", "name": "n.R", "fields": [{"name": "a", "type": {"type": "int", "name": "x"}}]},
                     {"type": "record", "name": "R", "namespace": "n", "doc": None,
                      "fields": [{"name": "a", "type": {"type": "int"}, "order": "ascending"}]}):
        assert AVRO.parse(json.dumps(spelling), ()).text(False) == canonical, spelling
    # namespaces only where they change, named types by name once written, other attributes kept (in their order),
    # sorted when normalized
    nested = {"type": "record", "name": "R", "namespace": "n", "b": 1, "a": 2, "aliases": ["n.Old", "o.P"],
              "fields": [{"name": "e", "type": {"type": "enum", "name": "E", "namespace": "n", "symbols": ["X"]}},
                         {"name": "f", "type": "n.E", "doc": "again"},
                         {"name": "g", "type": {"type": "fixed", "name": "F", "namespace": "o", "size": 2}}]}
    parsed = AVRO.parse(json.dumps(nested), ())
    assert json.loads(parsed.text(False)) == {
        "type": "record", "name": "R", "namespace": "n",
        "fields": [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
                   {"name": "f", "type": "E", "doc": "again"},
                   {"name": "g", "type": {"type": "fixed", "name": "F", "namespace": "o", "size": 2}}],
        "b": 1, "a": 2, "aliases": ["Old", "o.P"]}
    assert parsed.text(False).index('"b"') < parsed.text(False).index('"a"')
    assert parsed.text(True).index('"a"') < parsed.text(True).index('"b"')
    # a referenced type stays a name; format=resolved writes it inline
    dep = json.dumps({"type": "record", "name": "Inner", "namespace": "n", "fields": [{"name": "x", "type": "int"}]})
    outer = AVRO.parse(record({"name": "i", "type": "n.Inner"}, {"name": "j", "type": "n.Inner"}), (("n.Inner", dep),))
    assert json.loads(outer.text(False))["fields"][0]["type"] == "n.Inner"
    assert json.loads(outer.formatted("resolved"))["fields"] == [
        {"name": "i", "type": json.loads(dep)}, {"name": "j", "type": "n.Inner"}]


PROTO_MAPS = '''syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  message Early { string s = 1; }
  map<string, Early> by_name = 2;
  oneof pay { string card = 3; Line line = 4; }
  optional string note = 5;
  message Line { int32 n = 1; repeated double w = 2 [packed = false]; }
  map<int64, Line> lines = 6;
  google.protobuf.Timestamp at = 7 [json_name = "when"];
  Status status = 8;
  enum Status { UNKNOWN = 0; OK = 1; }
}
enum Top { T0 = 0; T1 = 1 [deprecated = true]; }
service Orders { rpc Get (Order) returns (stream Order); }
'''
PROTO2_GROUPS = '''syntax = "proto2";
package legacy;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FieldOptions { repeated int32 tags = 51236; optional Sub agg = 51237; }
message Sub { optional int32 a = 1; repeated string b = 2; extensions 100 to max; }
extend Sub { optional int64 ext_a = 100; }
message All {
  option deprecated = true;
  reserved 50, 60 to 70;
  reserved "gone";
  optional string s = 1 [default = "q\\"u\\\\o\\tt\\u00e8"];
  optional bytes b = 2 [default = "\\001\\377ab"];
  optional double d = 3 [default = inf];
  required uint64 u = 4 [(tags) = 1, (tags) = 2, (agg) = { a: 5 b: "x" [legacy.ext_a]: 9 }];
  optional group Grp = 5 { optional int32 gx = 1; repeated group Inner = 2 { optional string y = 1; } }
  extensions 1000 to 1999;
}
'''


def _descriptor_of(text: str, name: str) -> Any:
    """``text`` compiled by protoc as ``name``, without the default json_names, as a ``_pb2``'s descriptor comes."""
    from tabletopic.registry.protobuf_format import _compile
    from tabletopic.registry.protobuf_text import default_json_name

    fdp = _compile(name, text, ())
    for m in fdp.message_type:
        for f in m.field:
            if f.json_name == default_json_name(f.name):
                f.ClearField("json_name")
    return fdp


def test_protobuf_text_and_descriptor_are_one_text() -> None:
    import base64

    from google.protobuf import descriptor_pb2

    for text in (PROTO_MAPS, PROTO2_GROUPS):
        parsed = PROTO.parse(text, ())
        stored = parsed.text(False)
        assert stored.startswith("syntax = ") and "\nmessage " in stored  # .proto text, not base64
        fdp = _descriptor_of(text, "shop/order.proto")
        assert PROTO.parse(base64.b64encode(fdp.SerializeToString()).decode(), ()).text(False) == stored
        assert PROTO.parse(stored, ()).text(False) == stored
        # format=serialized: the descriptor compiled from the stored text, messages (map entries too) in order
        served = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(parsed.formatted("serialized")))
        assert [(m.name, [n.name for n in m.nested_type]) for m in served.message_type] == [
            (m.name, [n.name for n in m.nested_type]) for m in fdp.message_type]
    assert "map<string, .shop.Order.Early> by_name = 2;" in PROTO.parse(PROTO_MAPS, ()).text(False)
    # the Java serializer's text writes map fields as their entry messages (option map_entry, which protoc refuses)
    java = PROTO.parse(PROTO_MAPS, ()).text(False).replace(
        "map<string, .shop.Order.Early> by_name = 2;", "repeated .shop.Order.ByNameEntry by_name = 2;").replace(
        "message Line {", "message ByNameEntry {\n    option map_entry = true;\n  \n    string key = 1;\n"
                          "    .shop.Order.Early value = 2;\n  }\n  message Line {")
    assert PROTO.parse(java, ()).text(False) == PROTO.parse(PROTO_MAPS, ()).text(False)


def test_protobuf_bundled_imports_in_proto_text() -> None:
    text = proto('import "google/type/date.proto";\nimport "google/type/money.proto";\n'
                 'import "google/type/latlng.proto";\nimport "confluent/meta.proto";\n'
                 'import "confluent/type/decimal.proto";\nimport "google/type/datetime.proto";\n'
                 "message Shipment {\n  google.type.Date day = 1 [(confluent.field_meta).doc = \"the day\"];\n"
                 "  google.type.Money price = 2;\n  google.type.LatLng at = 3;\n"
                 "  confluent.type.Decimal weight = 4;\n  google.type.DateTime sent = 5;\n}")
    parsed = PROTO.parse(text, ())
    assert '.google.type.Date day = 1 [(confluent.field_meta) = { doc: "the day" }];' in parsed.text(False)
    assert PROTO.parse(parsed.formatted("serialized"), ()).text(False) == parsed.text(False)


@pytest.mark.parametrize(
    ("reader_field", "writer_field", "compatible"),
    [
        ("E id = 1;", "int32 id = 1;", True),  # an enum is a general number in Confluent
        ("int32 id = 1;", "E id = 1;", True),
        ("int64 id = 1;", "E id = 1;", True),
        ("F id = 1;", "E id = 1;", True),
        ("string id = 1;", "E id = 1;", False),
        ("sint32 id = 1;", "E id = 1;", False),
        ("Msg id = 1;", "E id = 1;", False),
    ],
)
def test_protobuf_enum_is_a_general_number(reader_field: str, writer_field: str, compatible: bool) -> None:
    body = "message Order {{ {} enum E {{ A = 0; }} enum F {{ B = 0; }} message Msg {{ int32 x = 1; }} }}"
    reader, writer = (PROTO.parse(proto(body.format(f)), ()) for f in (reader_field, writer_field))
    found = reader.can_read(writer)
    assert (not found) == compatible, found


ARR = {"type": "array"}


@pytest.mark.parametrize(
    ("reader", "writer", "readable"),
    [
        # tuples (items as a list) and additionalItems, as Confluent's ArraySchemaDiff
        ({**ARR, "items": [INT]}, {**ARR, "items": INT}, False),
        ({**ARR, "items": [INT, INT], "additionalItems": False}, {**ARR, "items": [INT]}, False),
        ({**ARR, "items": [INT, INT]}, {**ARR, "items": [INT, INT]}, True),
        ({**ARR, "items": [NUM, STR]}, {**ARR, "items": [INT, STR]}, True),
        ({**ARR, "items": [INT]}, {**ARR, "items": [INT, STR]}, True),  # the open reader takes the extra item
        ({**ARR, "items": [INT], "additionalItems": False}, {**ARR, "items": [INT, STR]}, False),
        ({**ARR, "items": [INT, STR]}, {**ARR, "items": [INT], "additionalItems": False}, True),
        ({**ARR, "items": [INT]}, {**ARR, "items": [INT], "additionalItems": False}, True),
        ({**ARR, "items": [INT], "additionalItems": NUM}, {**ARR, "items": [INT], "additionalItems": INT}, True),
        ({**ARR, "items": [INT], "additionalItems": INT}, {**ARR, "items": [INT], "additionalItems": NUM}, False),
        # not
        ({"not": {}}, True, False),
        ({"not": STR}, {"not": STR}, True),
        ({"not": STR}, {"not": {"type": ["string", "integer"]}}, True),
        ({"not": {"type": ["string", "integer"]}}, {"not": STR}, False),
        ({"type": "string", "not": {"const": "x"}}, STR, False),
        (STR, {"type": "string", "not": {"const": "x"}}, True),
        # a one-branch combination stands for its branch
        (STR, {"oneOf": [STR]}, True),
        ({"oneOf": [STR]}, STR, True),
        ({"anyOf": [STR]}, {"allOf": [STR]}, True),
        ({"anyOf": [STR, INT]}, {"anyOf": [STR]}, True),
        ({"oneOf": [STR]}, {"oneOf": [STR, INT]}, False),
        ({"allOf": [STR, {"maxLength": 3}]}, {"allOf": [STR]}, False),
        ({"oneOf": [STR, INT]}, {"allOf": [STR, INT]}, False),
    ],
)
def test_json_schema_tuples_not_and_combinations(reader: Any, writer: Any, readable: bool) -> None:
    assert json_reads(reader, writer) == readable


def test_schemas_stored_by_older_versions_keep_their_ids(tmp_path: Path) -> None:
    """Older versions stored PROTOBUF as base64 descriptors and AVRO as the JSON given: after a replay they are the
    canonical texts, under the same ids, and registering the schema in any spelling finds them."""
    import base64

    from tabletopic.registry.store import Content, Version, schema_record

    old_b64 = base64.b64encode(_descriptor_of(PROTO_MAPS, "shop/order.proto").SerializeToString()).decode()
    old_avro = json.dumps({"name": "R", "type": "record", "fields": [{"type": "int", "name": "a"}]}, indent=1)
    spelled_again = json.dumps({"fields": [{"name": "a", "type": "int"}], "type": "record", "name": "R"})

    async def older() -> None:
        async with opened(tmp_path) as svc:
            await svc.store.write([schema_record(Version("p", 1, 1, Content("PROTOBUF", old_b64))),
                                   schema_record(Version("a", 1, 2, Content("AVRO", old_avro))),
                                   schema_record(Version("a2", 1, 3, Content("AVRO", spelled_again)))])

    async def now() -> None:
        async with opened(tmp_path) as svc:
            assert svc.schema(1).schema == PROTO.parse(PROTO_MAPS, ()).text(False)
            assert svc.schema(2).schema == svc.schema(3).schema == AVRO.parse(old_avro, ()).text(False)
            for schema, schema_type in ((old_b64, "PROTOBUF"), (PROTO_MAPS, "PROTOBUF")):
                v = await svc.register("p", req(schema, schemaType=schema_type))
                assert (v.id, v.version) == (1, 1)
            v = await svc.register("a", req(spelled_again))
            assert (v.id, v.version) == (2, 1)
            assert (await svc.register("new", req(old_avro))).id == 2  # two ids became one text: the lower one

    run(older)
    run(now)
