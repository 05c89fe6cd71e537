"""The broker's schema registry through HTTP: confluent-kafka's own SchemaRegistryClient and Avro serializers
against a real broker, Confluent's API endpoint by endpoint with its error codes, bad input, and ids that stay the
same across a restart and a kill -9."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.helpers.procs import BrokerProcess, free_port
from tests.test_clients import consume_confluent, create_topic, produce_confluent

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def registry_broker(data_dir: Path) -> BrokerProcess:
    return BrokerProcess(data_dir, {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}"})


def url_of(b: BrokerProcess) -> str:
    return b.overrides["schema.registry.listeners"]


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker with its registry on for the endpoint tests (each test uses its own subjects)."""
    b = registry_broker(tmp_path_factory.mktemp("registry") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def http(reg: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url_of(reg), timeout=30) as c:
        yield c


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def avro(*fields: dict[str, Any], record: str = "Order") -> str:
    return json.dumps({"type": "record", "name": record, "namespace": "shop", "fields": list(fields)})


V1 = avro({"name": "id", "type": "long"}, {"name": "item", "type": "string"})
V2 = avro({"name": "id", "type": "long"}, {"name": "item", "type": "string"},
          {"name": "qty", "type": "int", "default": 1})
BREAKING = avro({"name": "id", "type": "long"}, {"name": "price", "type": "double"})


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(CONTENT_TYPE)
    return r.json()


def err(r: httpx.Response, status: int, code: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(CONTENT_TYPE)
    body = r.json()
    assert set(body) == {"error_code", "message"} and body["error_code"] == code, body
    assert "Traceback" not in body["message"]
    return str(body["message"])


# ---- the real client and serializers ----------------------------------------------------------------------------

def test_avro_serializer_round_trip_through_the_brokers_topic(reg: BrokerProcess) -> None:
    topic = name("orders")
    create_topic(reg, topic)
    client = SchemaRegistryClient({"url": url_of(reg)})
    # the serializer first asks /associations (404 here) and falls back to the topic subject, as with Confluent
    ser = AvroSerializer(client, V2, conf={"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows = [{"id": i, "item": f"item-{i}", "qty": i % 5} for i in range(50)]
    produce_confluent(reg, topic, [ser(r, ctx) for r in rows])

    registered = client.get_latest_version(f"{topic}-value")
    assert registered.version == 1 and json.loads(registered.schema.schema_str) == json.loads(V2)
    got = consume_confluent(reg, topic, len(rows))
    assert all(v[0] == 0 for _, _, v in got)  # Confluent framing: magic byte 0 ...
    assert {int.from_bytes(v[1:5], "big") for _, _, v in got} == {registered.schema_id}  # ... then the id
    # a fresh client (no cache) decodes with the writer schema fetched by id
    de = AvroDeserializer(SchemaRegistryClient({"url": url_of(reg)}))
    assert [de(v, ctx) for _, _, v in got] == rows


def test_json_serializer_round_trip_and_json_compatibility(reg: BrokerProcess) -> None:
    topic = name("events")
    create_topic(reg, topic)
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Event", "type": "object",
              "properties": {"id": {"type": "integer"}, "kind": {"type": "string"}}, "required": ["id"]}
    client = SchemaRegistryClient({"url": url_of(reg)})
    ser = JSONSerializer(json.dumps(schema), client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows = [{"id": i, "kind": "click" if i % 2 else "view"} for i in range(20)]
    produce_confluent(reg, topic, [ser(r, ctx) for r in rows])
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "JSON" and json.loads(registered.schema.schema_str) == schema
    de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": url_of(reg)}))
    assert [de(v, ctx) for _, _, v in consume_confluent(reg, topic, len(rows))] == rows
    # the open content model: a new property is not BACKWARD compatible, as in Confluent's registry
    added = {**schema, "properties": {**schema["properties"], "ts": {"type": "integer"}}}
    with pytest.raises(SchemaRegistryError) as ei:
        client.register_schema(f"{topic}-value", Schema(json.dumps(added), "JSON"))
    assert ei.value.http_status_code == 409
    widened = {**schema, "properties": {**schema["properties"], "id": {"type": "number"}}}
    assert client.register_schema(f"{topic}-value", Schema(json.dumps(widened), "JSON")) != registered.schema_id


MONEY_PROTO = 'syntax = "proto3";\npackage common;\nmessage Money { int64 cents = 1; string currency = 2; }\n'
ORDER_PROTO = ('syntax = "proto3";\npackage shop;\nimport "google/protobuf/timestamp.proto";\n'
               'import "common/money.proto";\nmessage Order { int64 id = 1; string item = 2; '
               'google.protobuf.Timestamp at = 3; common.Money price = 4; repeated string tags = 5; }\n')


def proto_class(tmp_path: Path, files: dict[str, str], message: str) -> Any:
    """The message class of ``message``, compiled from ``files`` by grpcio-tools' protoc."""
    return message_factory.GetMessageClass(proto_pool(tmp_path, files).FindMessageTypeByName(message))


def proto_pool(tmp_path: Path, files: dict[str, str]) -> descriptor_pool.DescriptorPool:
    """A pool of ``files`` and their imports, compiled by grpcio-tools' protoc."""
    import grpc_tools

    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    out = tmp_path / "set.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}",
                    f"-I{Path(grpc_tools.__file__).parent / '_proto'}", "--include_imports",
                    f"--descriptor_set_out={out}", *files], check=True, capture_output=True)
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(f)
    return pool


def test_protobuf_serializer_round_trip_with_an_import(reg: BrokerProcess, tmp_path: Path) -> None:
    topic = name("shipments")
    create_topic(reg, topic)
    order = proto_class(tmp_path, {"common/money.proto": MONEY_PROTO, "shop/order.proto": ORDER_PROTO}, "shop.Order")
    client = SchemaRegistryClient({"url": url_of(reg)})
    ser = ProtobufSerializer(order, client)  # registers common/money.proto first, then the topic's subject
    ctx = SerializationContext(topic, MessageField.VALUE)
    messages = []
    for i in range(20):
        m = order(id=i, item=f"item-{i}", tags=["a", str(i)])
        m.price.cents, m.price.currency, m.at.seconds = 100 * i, "EUR", 1_700_000_000 + i
        messages.append(m)
    produce_confluent(reg, topic, [ser(m, ctx) for m in messages])
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "PROTOBUF"
    assert [(r.name, r.subject, r.version) for r in registered.schema.references] == [
        ("common/money.proto", "common/money.proto", 1)]
    # a fresh client resolves the writer schema and its import from the registry (format=serialized)
    de = ProtobufDeserializer(order, {}, SchemaRegistryClient({"url": url_of(reg)}))
    assert [de(v, ctx) for _, _, v in consume_confluent(reg, topic, len(messages))] == messages
    # .proto text is accepted too; changing a field's type is refused
    refs = [SchemaReference("common/money.proto", "common/money.proto", 1)]
    changed = ORDER_PROTO.replace("int64 id = 1", "string id = 1")
    with pytest.raises(SchemaRegistryError) as ei:
        client.register_schema(f"{topic}-value", Schema(changed, "PROTOBUF", refs))
    assert ei.value.http_status_code == 409 and "FIELD_SCALAR_KIND_CHANGED" in ei.value.error_message
    added = ORDER_PROTO.replace("repeated string tags = 5;", "repeated string tags = 5; string note = 6;")
    assert client.register_schema(f"{topic}-value", Schema(added, "PROTOBUF", refs)) > registered.schema_id


def test_client_api_and_incompatible_schema(reg: BrokerProcess) -> None:
    client = SchemaRegistryClient({"url": url_of(reg)})
    subject = name("client")
    first = client.register_schema(subject, Schema(V1, "AVRO"))
    assert client.register_schema(subject, Schema(V1, "AVRO")) == first
    second = client.register_schema(subject, Schema(V2, "AVRO"))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    assert client.lookup_schema(subject, Schema(V1, "AVRO")).version == 1
    assert client.test_compatibility(subject, Schema(BREAKING, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as ei:
        client.register_schema(subject, Schema(BREAKING, "AVRO"))
    assert ei.value.http_status_code == 409 and ei.value.error_code == 40901
    assert client.get_versions(subject) == [1, 2]  # nothing registered
    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    assert client.register_schema(subject, Schema(BREAKING, "AVRO")) not in (first, second)
    assert client.delete_subject(subject) == [1, 2, 3]
    assert subject not in client.get_subjects()
    assert client.delete_subject(subject, permanent=True) == [1, 2, 3]
    assert client.get_schema_types() == ["AVRO", "JSON", "PROTOBUF"]


# ---- endpoint by endpoint ---------------------------------------------------------------------------------------

def test_register_lookup_and_read(http: httpx.Client) -> None:
    s, other = name("s"), name("o")
    record = f"Only_{uuid.uuid4().hex}"  # no other test holds these schemas' ids
    mine = avro({"name": "id", "type": "long"}, record=record)
    mine_v2 = avro({"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}, record=record)
    body = {"schema": mine}
    first = ok(http.post(f"/subjects/{s}/versions", json=body))
    assert first["id"] > 0 and first["version"] == 1
    assert ok(http.post(f"/subjects/{s}/versions", json={"schema": mine.replace(", ", ",  ")}))["id"] == first["id"]
    assert ok(http.post(f"/subjects/{other}/versions", json=body))["id"] == first["id"]  # same schema, same id
    v2 = ok(http.post(f"/subjects/{s}/versions?normalize=true", json={"schema": mine_v2}))
    assert v2["version"] == 2 and v2["id"] != first["id"]

    found = ok(http.post(f"/subjects/{s}", json=body))
    assert (found["subject"], found["version"], found["id"]) == (s, 1, first["id"])
    assert json.loads(found["schema"]) == json.loads(mine)
    err(http.post(f"/subjects/{s}", json={"schema": BREAKING}), 404, 40403)
    err(http.post(f"/subjects/{name('none')}", json=body), 404, 40401)

    assert json.loads(ok(http.get(f"/schemas/ids/{first['id']}"))["schema"]) == json.loads(mine)
    assert ok(http.get(f"/schemas/ids/{first['id']}?subject={s}&format=serialized"))["schema"]
    assert ok(http.get(f"/schemas/ids/{first['id']}/schema")) == json.loads(mine)
    assert ok(http.get(f"/schemas/ids/{first['id']}/versions")) == sorted(
        [{"subject": s, "version": 1}, {"subject": other, "version": 1}], key=lambda d: str(d["subject"]))
    assert ok(http.get(f"/schemas/ids/{first['id']}/subjects")) == sorted([s, other])
    assert ok(http.get("/schemas/types")) == ["AVRO", "JSON", "PROTOBUF"]
    assert ok(http.get("/contexts")) == ["."]
    err(http.get("/schemas/ids/987654"), 404, 40403)

    assert {s, other} <= set(ok(http.get("/subjects")))
    assert ok(http.get(f"/subjects?subjectPrefix={s}")) == [s]
    assert ok(http.get(f"/subjects/{s}/versions")) == [1, 2]
    for spec, version in (("latest", 2), ("-1", 2), ("1", 1)):
        got = ok(http.get(f"/subjects/{s}/versions/{spec}"))
        assert (got["subject"], got["version"]) == (s, version)
    assert ok(http.get(f"/subjects/{s}/versions/1/schema")) == json.loads(mine)
    err(http.get(f"/subjects/{s}/versions/3"), 404, 40402)
    err(http.get(f"/subjects/{s}/versions/zero"), 422, 42202)
    err(http.get(f"/subjects/{s}/versions/0"), 422, 42202)
    err(http.get(f"/subjects/{name('none')}/versions"), 404, 40401)


def test_references_and_referencedby(http: httpx.Client) -> None:
    inner_subject, outer_subject = name("inner"), name("outer")
    inner = avro({"name": "street", "type": "string"}, record="Address")
    inner_id = ok(http.post(f"/subjects/{inner_subject}/versions", json={"schema": inner}))["id"]
    outer = avro({"name": "ship_to", "type": "shop.Address"}, record="Shipment")
    refs = [{"name": "shop.Address", "subject": inner_subject, "version": 1}]
    err(http.post(f"/subjects/{outer_subject}/versions", json={"schema": outer}), 422, 42201)
    outer_id = ok(http.post(f"/subjects/{outer_subject}/versions", json={"schema": outer, "references": refs}))["id"]
    assert ok(http.get(f"/schemas/ids/{outer_id}"))["references"] == refs
    assert ok(http.get(f"/subjects/{inner_subject}/versions/1/referencedby")) == [outer_id]
    err(http.delete(f"/subjects/{inner_subject}"), 422, 42206)
    err(http.delete(f"/subjects/{inner_subject}/versions/1"), 422, 42206)
    assert ok(http.delete(f"/subjects/{outer_subject}")) == [1]
    assert ok(http.get(f"/subjects/{inner_subject}/versions/1/referencedby")) == []
    assert ok(http.delete(f"/subjects/{inner_subject}")) == [1]
    assert inner_id != outer_id


def test_soft_and_permanent_deletes(http: httpx.Client) -> None:
    s = name("del")
    for schema in (V1, V2):
        ok(http.post(f"/subjects/{s}/versions", json={"schema": schema}))
    err(http.delete(f"/subjects/{s}/versions/1?permanent=true"), 404, 40407)
    assert ok(http.delete(f"/subjects/{s}/versions/1")) == 1
    err(http.delete(f"/subjects/{s}/versions/1"), 404, 40406)
    err(http.get(f"/subjects/{s}/versions/1"), 404, 40402)
    assert ok(http.get(f"/subjects/{s}/versions/1?deleted=true"))["version"] == 1
    assert ok(http.get(f"/subjects/{s}/versions?deleted=true")) == [1, 2]
    first_id = ok(http.get(f"/subjects/{s}/versions/1?deleted=true"))["id"]
    assert ok(http.get(f"/schemas/ids/{first_id}"))  # a soft-deleted version's id still resolves
    assert ok(http.delete(f"/subjects/{s}/versions/1?permanent=true")) == 1
    err(http.delete(f"/subjects/{s}?permanent=true"), 404, 40405)
    assert ok(http.delete(f"/subjects/{s}")) == [2]
    err(http.delete(f"/subjects/{s}"), 404, 40404)
    assert s not in ok(http.get("/subjects")) and s in ok(http.get("/subjects?deleted=true"))
    err(http.get(f"/subjects/{s}/versions"), 404, 40401)
    assert ok(http.delete(f"/subjects/{s}?permanent=true")) == [2]
    assert s not in ok(http.get("/subjects?deleted=true"))
    err(http.delete(f"/subjects/{s}"), 404, 40401)


def test_config_compatibility_and_mode(http: httpx.Client) -> None:
    s = name("cfg")
    assert ok(http.get("/config")) == {"compatibilityLevel": "BACKWARD"}
    err(http.get(f"/config/{s}"), 404, 40408)
    assert ok(http.get(f"/config/{s}?defaultToGlobal=true")) == {"compatibilityLevel": "BACKWARD"}
    assert ok(http.put(f"/config/{s}", json={"compatibility": "forward"})) == {"compatibility": "FORWARD"}
    assert ok(http.get(f"/config/{s}")) == {"compatibilityLevel": "FORWARD"}
    err(http.put(f"/config/{s}", json={"compatibility": "SIDEWAYS"}), 422, 42203)
    err(http.put("/config", json={"compatibility": 5}), 422, 42203)

    # compatibility checks: against all live versions or one
    assert ok(http.post(f"/compatibility/subjects/{s}/versions", json={"schema": V1})) == {"is_compatible": True}
    ok(http.post(f"/subjects/{s}/versions", json={"schema": V1}))
    # FORWARD: V1 must read what the new schema writes; a new required field is fine, a dropped one is not
    assert ok(http.post(f"/compatibility/subjects/{s}/versions/latest", json={"schema": V2}))["is_compatible"]
    verdict = ok(http.post(f"/compatibility/subjects/{s}/versions?verbose=true", json={"schema": BREAKING}))
    assert verdict["is_compatible"] is False and verdict["messages"]
    err(http.post(f"/compatibility/subjects/{s}/versions/7", json={"schema": V1}), 404, 40402)
    err(http.post(f"/compatibility/subjects/{name('x')}/versions/1", json={"schema": V1}), 404, 40402)
    err(http.post(f"/subjects/{s}/versions", json={"schema": BREAKING}), 409, 40901)
    assert ok(http.delete(f"/config/{s}")) == {"compatibilityLevel": "FORWARD"}
    err(http.delete(f"/config/{s}"), 404, 40401)

    # modes
    assert ok(http.get("/mode")) == {"mode": "READWRITE"}
    err(http.get(f"/mode/{s}"), 404, 40409)
    assert ok(http.put(f"/mode/{s}", json={"mode": "READONLY"})) == {"mode": "READONLY"}
    err(http.post(f"/subjects/{s}/versions", json={"schema": V2}), 422, 42205)
    err(http.put(f"/mode/{s}", json={"mode": "SIDEWAYS"}), 422, 42204)
    assert ok(http.delete(f"/mode/{s}")) == {"mode": "READONLY"}
    err(http.put("/mode", json={"mode": "IMPORT"}), 422, 42205)  # subjects exist
    assert ok(http.get(f"/mode/{s}?defaultToGlobal=true")) == {"mode": "READWRITE"}
    assert ok(http.post(f"/subjects/{s}/versions", json={"schema": V2}))["version"] == 2


def test_bad_input_gets_confluent_errors_and_the_broker_keeps_serving(reg: BrokerProcess, http: httpx.Client) -> None:
    s = name("bad")
    err(http.post(f"/subjects/{s}/versions", content=b"{not json"), 400, 400)
    err(http.post(f"/subjects/{s}/versions", content=b"[1, 2]"), 400, 400)
    err(http.post(f"/subjects/{s}/versions", content=b"[" * 100_000), 400, 400)
    err(http.post(f"/subjects/{s}/versions", json={"schema": "{\"type\": \"nope\"}"}), 422, 42201)
    err(http.post(f"/subjects/{s}/versions", json={"schema": ""}), 422, 42201)
    err(http.post(f"/subjects/{s}/versions", json={"schema": V1, "schemaType": "XML"}), 422, 42201)
    err(http.post(f"/subjects/{s}/versions", json={"schema": V1, "references": "no"}), 400, 400)
    err(http.post(f"/subjects/{s}/versions", content=b"x" * (5 << 20)), 413, 413)
    err(http.get("/no/such/route"), 404, 404)
    err(http.get("/associations/resources/default/orders"), 404, 404)
    err(http.patch("/subjects"), 405, 405)
    err(http.get("/schemas/ids/abc"), 404, 404)
    # not HTTP, a broken header, a body cut short by a client that goes away
    host, port = str(http.base_url.host), int(http.base_url.port or 0)
    for raw in (b"\x00\x01garbage\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                b"POST /subjects/x/versions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"sch"):
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(raw)
            conn.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                conn.recv(1024)
    # the registry and the broker still serve
    assert isinstance(ok(http.get("/subjects")), list)
    topic = name("after-bad")
    create_topic(reg, topic)
    produce_confluent(reg, topic, [b"v"])
    assert [v for _, _, v in consume_confluent(reg, topic, 1)] == [b"v"]
    assert "Traceback" not in reg.log_text()


# ---- Confluent's behaviour word for word (issue 23 item 3) --------------------------------------------------------

def client_error(call: Any) -> tuple[int, int, str]:
    """(HTTP status, error code, message) of a SchemaRegistryClient call that must fail."""
    with pytest.raises(SchemaRegistryError) as ei:
        call()
    return ei.value.http_status_code, ei.value.error_code, ei.value.error_message


def test_compatibility_of_a_new_subject_and_of_missing_versions(reg: BrokerProcess, http: httpx.Client) -> None:
    client, s = SchemaRegistryClient({"url": url_of(reg)}), name("fresh")
    # what the Java client's testCompatibility and the Maven plugin send before the first registration
    assert client.test_compatibility(s, Schema(V1, "AVRO")) is True
    assert client_error(lambda: client.test_compatibility(s, Schema(V1, "AVRO"), version=1)) == (
        404, 40402, "Version 1 not found.")
    client.register_schema(s, Schema(V1, "AVRO"))
    client.register_schema(s, Schema(V2, "AVRO"))
    assert client.delete_version(s, 1) == 1
    assert client_error(lambda: client.test_compatibility(s, Schema(V1, "AVRO"), version=1)) == (
        404, 40402, "Version 1 not found.")  # soft-deleted
    assert client.test_compatibility(s, Schema(V1, "AVRO"), version=2) is True
    client.delete_subject(s)
    assert client.test_compatibility(s, Schema(BREAKING, "AVRO")) is True  # no live version left to break
    # a blank or invalid schema: 42201, or with verbose=true incompatible with the reason as the message
    assert err(http.post(f"/compatibility/subjects/{s}/versions/latest", json={"schema": ""}), 422, 42201) == (
        "Empty schema")
    verdict = ok(http.post(f"/compatibility/subjects/{s}/versions/latest?verbose=true", json={"schema": "{"}))
    assert verdict["is_compatible"] is False
    assert verdict["messages"][0].startswith("Invalid schema of type AVRO, details: ")


def test_list_schemas(http: httpx.Client) -> None:
    prefix = name("listed")
    a, b = f"{prefix}-a", f"{prefix}-b"
    ids = [ok(http.post(f"/subjects/{subj}/versions", json={"schema": sch}))["id"]
           for subj, sch in ((a, V1), (a, V2), (b, V1))]

    def listed(**params: str) -> list[tuple[str, int]]:
        got = ok(http.get("/schemas", params={"subjectPrefix": prefix, **params}))
        return [(x["subject"], x["version"]) for x in got]

    every = ok(http.get("/schemas", params={"subjectPrefix": prefix}))
    assert [(x["subject"], x["version"], x["id"]) for x in every] == [(a, 1, ids[0]), (a, 2, ids[1]), (b, 1, ids[2])]
    assert json.loads(every[1]["schema"]) == json.loads(V2)
    assert listed(latestOnly="true") == [(a, 2), (b, 1)]
    assert listed(offset="1", limit="1") == [(a, 2)]
    assert listed(limit="0") == listed() == [(a, 1), (a, 2), (b, 1)]  # a limit that is not positive: the default
    ok(http.delete(f"/subjects/{a}/versions/2"))
    assert listed() == [(a, 1), (b, 1)]
    assert listed(deleted="true") == [(a, 1), (a, 2), (b, 1)]
    assert listed(latestOnly="true") == [(a, 1), (b, 1)]
    assert listed(latestOnly="true", deleted="true") == [(a, 2), (b, 1)]
    assert {(a, 1), (b, 1)} <= {(x["subject"], x["version"]) for x in ok(http.get("/schemas"))}
    err(http.get("/schemas", params={"limit": "ten"}), 404, 404)  # Jersey's answer to a parameter it cannot read


def test_content_negotiation(http: httpx.Client) -> None:
    for accept, answered in ((None, CONTENT_TYPE), ("*/*", CONTENT_TYPE), ("application/*", CONTENT_TYPE),
                             ("application/json", "application/json"),
                             ("application/vnd.schemaregistry+json", "application/vnd.schemaregistry+json"),
                             ("text/html, application/json;q=0.9, */*;q=0.1", "application/json"),
                             (f"application/json, {CONTENT_TYPE}", CONTENT_TYPE)):
        r = http.get("/schemas/types", headers={} if accept is None else {"Accept": accept})
        assert (r.status_code, r.headers["content-type"], r.json()) == (200, answered, ["AVRO", "JSON", "PROTOBUF"])
    # errors come in the negotiated type too
    r = http.get(f"/subjects/{name('none')}/versions", headers={"Accept": "application/json"})
    assert (r.status_code, r.headers["content-type"], r.json()["error_code"]) == (404, "application/json", 40401)
    assert err(http.get("/subjects", headers={"Accept": "text/html"}), 406, 406) == "HTTP 406 Not Acceptable"
    # bodies: Confluent's JSON types and application/octet-stream (what no Content-Type means) are read
    s, body = name("ctype"), json.dumps({"schema": V1}).encode()
    for ctype in ("application/x-www-form-urlencoded", "text/plain"):  # curl -d without -H sends the first
        r = http.post(f"/subjects/{s}/versions", content=body, headers={"Content-Type": ctype})
        assert err(r, 415, 415) == "HTTP 415 Unsupported Media Type"
    for headers in ({}, {"Content-Type": "application/json; charset=utf-8"},
                    {"Content-Type": "application/vnd.schemaregistry+json"}):
        assert ok(http.post(f"/subjects/{s}/versions", content=body, headers=headers))["version"] == 1


def test_error_texts_word_for_word(reg: BrokerProcess, http: httpx.Client) -> None:
    client, s = SchemaRegistryClient({"url": url_of(reg)}), name("texts")
    first = client.register_schema(s, Schema(V1, "AVRO"))
    assert client_error(lambda: client.get_version(s, 15)) == (404, 40402, "Version 15 not found.")
    missing = name("none")
    assert client_error(lambda: client.get_version(missing, 1)) == (404, 40401, f"Subject '{missing}' not found.")
    assert err(http.post(f"/subjects/{name('empty')}/versions", json={"schema": ""}), 422, 42201) == "Empty schema"
    assert ok(http.post(f"/subjects/{s}/versions", json={"schema": ""})) == {"id": first, "version": 1}
    assert client_error(lambda: client.set_compatibility(s, "SIDEWAYS")) == (
        422, 42203, "Invalid compatibility level. Valid values are none, backward, forward, full, "
                    "backward_transitive, forward_transitive, and full_transitive")
    assert err(http.put(f"/mode/{s}", json={"mode": "SIDEWAYS"}), 422, 42204) == (
        "Invalid mode. Valid values are READWRITE, READONLY, IMPORT and FORWARD.")
    problem = client_error(lambda: client.register_schema(s, Schema(BREAKING, "AVRO")))
    assert problem[:2] == (409, 40901) and problem[2].startswith(
        f"Schema being registered is incompatible with an earlier schema for subject \"{s}\", details: [")
    assert problem[2].endswith(", {validateFields: 'false', compatibility: 'BACKWARD'}]")
    assert client.delete_version(s, 1) == 1
    assert client_error(lambda: client.delete_version(s, 1)) == (
        404, 40406, f"Subject '{s}' Version 1 was soft deleted.Set permanent=true to delete permanently")
    assert client_error(lambda: client.delete_subject(s)) == (
        404, 40404, f"Subject '{s}' was soft deleted.Set permanent=true to delete permanently")
    inner, outer = name("inner"), name("outer")
    ok(http.post(f"/subjects/{inner}/versions", json={"schema": avro({"name": "x", "type": "int"}, record="In")}))
    ok(http.post(f"/subjects/{outer}/versions", json={
        "schema": avro({"name": "i", "type": "shop.In"}, record="Out"),
        "references": [{"name": "shop.In", "subject": inner, "version": 1}]}))
    assert client_error(lambda: client.delete_subject(inner)) == (
        422, 42206, f"One or more references exist to the schema {{magic=1,keytype=SCHEMA,subject={inner},version=1}}.")
    assert client.update_mode(outer, "readonly") == "readonly"  # the request echoed, as Confluent does
    assert client_error(lambda: client.delete_version(outer, 1)) == (
        422, 42205, f"Subject {outer} in context  is in read-only mode")
    assert client.delete_mode(outer) == "READONLY"
    assert err(http.get("/schemas/ids/987654321/versions"), 404, 40403) == "Schema not found"
    assert err(http.delete(f"/config/{outer}"), 404, 40401) == f"Subject '{outer}' not found."
    assert err(http.delete(f"/mode/{outer}"), 404, 40401) == f"Subject '{outer}' not found."


# ---- durability -------------------------------------------------------------------------------------------------

def _ids(c: httpx.Client, subjects: list[str]) -> dict[str, list[int]]:
    return {s: [ok(c.get(f"/subjects/{s}/versions/{v}"))["id"] for v in ok(c.get(f"/subjects/{s}/versions"))]
            for s in subjects}


def test_ids_survive_restart_and_kill_9(tmp_path: Path) -> None:
    b = registry_broker(tmp_path / "data")
    b.start()
    try:
        with httpx.Client(base_url=url_of(b), timeout=30) as c:
            ok(c.post("/subjects/a/versions", json={"schema": V1}))
            ok(c.post("/subjects/a/versions", json={"schema": V2}))
            ok(c.post("/subjects/b/versions", json={"schema": V1}))
            gone = ok(c.post("/subjects/gone/versions", json={"schema": BREAKING}))["id"]
            ok(c.delete("/subjects/gone"))
            ok(c.delete("/subjects/gone?permanent=true"))
            ok(c.put("/config/a", json={"compatibility": "FULL"}))
            before = _ids(c, ["a", "b"])
        assert _topics(b) >= {"_schemas"}  # kept in the broker's own log, visible to Kafka clients

        b.restart()
        with httpx.Client(base_url=url_of(b), timeout=30) as c:
            assert _ids(c, ["a", "b"]) == before
            assert ok(c.get("/config/a")) == {"compatibilityLevel": "FULL"}
            err(c.get(f"/schemas/ids/{gone}"), 404, 40403)
            later = avro({"name": "id", "type": "long"}, record="Later")
            later_id = ok(c.post("/subjects/c/versions", json={"schema": later}))["id"]
            assert later_id > gone  # a permanently deleted schema's id is never given again

        b.kill()
        b.start()
        with httpx.Client(base_url=url_of(b), timeout=30) as c:
            assert _ids(c, ["a", "b", "c"]) == {**before, "c": [later_id]}  # acknowledged = durable
            newest = avro({"name": "n", "type": "int"}, record="Newest")
            assert ok(c.post("/subjects/d/versions", json={"schema": newest}))["id"] == later_id + 1
    finally:
        b.stop()


def _topics(b: BrokerProcess) -> set[str]:
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=30)
    return set(md.topics)


# ---- schema formats as Confluent's (issue 23 item 3.2, 3.3, 3.4, 3.6, 3.7) -------------------------------------

CART_PROTO = ('syntax = "proto3";\npackage shop;\nmessage Cart {\n  int64 id = 1;\n  map<string, int64> counts = 2;\n'
              "  Line line = 3;\n  Status status = 4;\n  message Line { int32 n = 1; }\n"
              "  enum Status { UNKNOWN = 0; OK = 1; }\n}\n")
# the same schema as the Java serializer sends it: Confluent's rendering of its descriptor (full names, the map as
# its entry message)
CART_JAVA = '''syntax = "proto3";
package shop;

message Cart {
  int64 id = 1;
  repeated .shop.Cart.CountsEntry counts = 2;
  .shop.Cart.Line line = 3;
  .shop.Cart.Status status = 4;

  message CountsEntry {
    option map_entry = true;

    string key = 1;
    int64 value = 2;
  }
  message Line {
    int32 n = 1;
  }
  enum Status {
    UNKNOWN = 0;
    OK = 1;
  }
}
'''


def test_protobuf_from_python_and_java_serializers_is_one_schema(reg: BrokerProcess, http: httpx.Client,
                                                                  tmp_path: Path) -> None:
    topic = name("carts")
    create_topic(reg, topic)
    cart = proto_class(tmp_path, {"shop/cart.proto": CART_PROTO}, "shop.Cart")
    client = SchemaRegistryClient({"url": url_of(reg)})
    ctx = SerializationContext(topic, MessageField.VALUE)
    message = cart(id=7, status=1)
    message.counts["apples"] = 3
    produce_confluent(reg, topic, [ProtobufSerializer(cart, client)(message, ctx)])  # registers the base64 form
    subject = f"{topic}-value"
    registered = client.get_latest_version(subject)
    # the Java serializer's text finds the same id and version, registering and looking up
    body = {"schema": CART_JAVA, "schemaType": "PROTOBUF"}
    assert ok(http.post(f"/subjects/{subject}/versions", json=body)) == {"id": registered.schema_id, "version": 1}
    assert ok(http.post(f"/subjects/{subject}", json=body))["version"] == 1
    assert client.register_schema(subject, Schema(CART_PROTO, "PROTOBUF")) == registered.schema_id
    assert client.get_versions(subject) == [1]
    # answered as .proto text; format=serialized gives the descriptor, which deserializers read
    text = ok(http.get(f"/schemas/ids/{registered.schema_id}"))["schema"]
    assert text.startswith('syntax = "proto3";') and "map<string, int64> counts = 2;" in text
    assert registered.schema.schema_str == text
    served = client.get_schema(registered.schema_id, fmt="serialized").schema_str
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served))
    assert [n.name for n in fdp.message_type[0].nested_type] == ["CountsEntry", "Line"]
    de = ProtobufDeserializer(cart, {}, SchemaRegistryClient({"url": url_of(reg)}))
    assert [de(v, ctx) for _, _, v in consume_confluent(reg, topic, 1)] == [message]


def test_protobuf_imports_confluent_bundles(http: httpx.Client) -> None:
    text = ('syntax = "proto3";\npackage shop;\nimport "google/type/date.proto";\nimport "google/type/money.proto";\n'
            'import "google/type/latlng.proto";\nimport "confluent/meta.proto";\n'
            'import "confluent/type/decimal.proto";\n'
            'message Shipment {\n  google.type.Date day = 1 [(confluent.field_meta).doc = "shipping day"];\n'
            "  google.type.Money price = 2;\n  google.type.LatLng at = 3;\n  confluent.type.Decimal weight = 4;\n}\n")
    subject = name("bundled")
    sid = ok(http.post(f"/subjects/{subject}/versions", json={"schema": text, "schemaType": "PROTOBUF"}))["id"]
    stored = ok(http.get(f"/schemas/ids/{sid}"))["schema"]
    assert '.google.type.Date day = 1 [(confluent.field_meta) = { doc: "shipping day" }];' in stored
    served = ok(http.get(f"/subjects/{subject}/versions/1", params={"format": "serialized"}))["schema"]
    assert descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served)).dependency[:2] == [
        "google/type/date.proto", "google/type/money.proto"]


def test_avro_spellings_of_one_schema_get_one_id(reg: BrokerProcess, http: httpx.Client) -> None:
    client = SchemaRegistryClient({"url": url_of(reg)})
    subject = name("avro-one")
    record = f"Only_{uuid.uuid4().hex}"
    first = json.dumps({"type": "record", "name": record, "namespace": "shop",
                        "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]})
    sid = client.register_schema(subject, Schema(first, "AVRO"))
    for spelling in ({"fields": [{"type": "long", "name": "id"}, {"type": "string", "name": "item"}],
                      "name": record, "type": "record", "namespace": "shop"},
                     {"type": "record", "name": f"shop.{record}",
                      "fields": [{"name": "id", "type": {"type": "long", "name": "x"}},
                                 {"name": "item", "type": {"type": "string"}}]}):
        assert client.register_schema(subject, Schema(json.dumps(spelling), "AVRO")) == sid
        assert client.lookup_schema(subject, Schema(json.dumps(spelling), "AVRO")).version == 1
    assert client.get_versions(subject) == [1]
    assert json.loads(ok(http.get(f"/schemas/ids/{sid}"))["schema"]) == json.loads(first)


@pytest.mark.parametrize(
    ("schema_type", "old", "new", "compatible"),
    [
        ("PROTOBUF", "message M { int32 kind = 1; }", "message M { Kind kind = 1; enum Kind { A = 0; B = 1; } }", True),
        ("JSON", {"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": [{"type": "integer"}]},
         False),
        ("JSON", {"type": "array", "items": [{"type": "integer"}]},
         {"type": "array", "items": [{"type": "integer"}, {"type": "integer"}], "additionalItems": False}, False),
        ("JSON", True, {"not": {}}, False),
        ("JSON", {"oneOf": [{"type": "string"}]}, {"type": "string"}, True),
    ],
)
def test_compatibility_as_confluents(reg: BrokerProcess, schema_type: str, old: Any, new: Any,
                                     compatible: bool) -> None:
    client = SchemaRegistryClient({"url": url_of(reg)})
    subject = name("compat")
    text = (lambda s: f'syntax = "proto3";\npackage shop;\n{s}\n') if schema_type == "PROTOBUF" else json.dumps
    client.register_schema(subject, Schema(text(old), schema_type))
    assert client.test_compatibility(subject, Schema(text(new), schema_type)) is compatible
