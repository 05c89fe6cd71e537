"""Table topic settings checked against what the topic's table really is, through real clients and a real broker:
``partition.by`` against the columns the converters produce, converter changes against an existing table, and
settings that nothing implements yet. Refusals are INVALID_CONFIG naming the key, the value and the reason."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from pyiceberg.schema import Schema

from tabletopic.cli import kafka_configs, kafka_topics
from tests.helpers.procs import BrokerProcess, free_port
from tests.test_table_topics import catalog, create, produce, wait_for_table

P = "automq.table.topic."
PB = P + "partition.by"
_ids = itertools.count()


def unique(prefix: str = "chk") -> str:
    return f"{prefix}-{next(_ids)}"


def cli(capsys: pytest.CaptureFixture[str], main: Any, bootstrap: str, *args: str) -> tuple[int, str]:
    code = main(["--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out + err


def admin_error(fut: Any) -> KafkaError:
    with pytest.raises(KafkaException) as ei:
        fut.result(timeout=30)
    err: KafkaError = ei.value.args[0]
    return err


def incremental_set(client: AdminClient, topic: str, validate_only: bool = False, **configs: str) -> Any:
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    (fut,) = client.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)],
                                              validate_only=validate_only).values()
    return fut


# ---- partition.by against the topic's columns -----------------------------------------------------------

BAD_SPECS = [
    # (value, other settings, what the message must say besides key and value)
    ("[bucket(nosuchcol, 8)]", {}, ["nosuchcol", "unknown column", "_kafka_key (string)",
                                    "_kafka_metadata.timestamp (long)"]),
    ("[nosuch]", {}, ["nosuch", "unknown column"]),
    ("[day(_kafka_metadata.timestamp)]", {}, ["_kafka_metadata.timestamp", "long", "date or timestamp"]),
    ("[bucket(_kafka_metadata, 8)]", {}, ["_kafka_metadata", "struct"]),
    ("[truncate(_kafka_header, 4)]", {}, ["_kafka_header", "map<string, binary>"]),
    ("[_kafka_header]", {}, ["_kafka_header", "map<string, binary>"]),
    ("[hour(_kafka_key)]", {}, ["_kafka_key", "string"]),
    ("[_kafka_key.sub]", {}, ["_kafka_key.sub", "unknown column"]),
    # the legacy layout has no _kafka_value column, only value
    ("[truncate(_kafka_value, 4)]", {P + "schema.type": "schemaless"}, ["_kafka_value", "unknown column"]),
]


@pytest.mark.parametrize(("spec", "extra", "needles"), BAD_SPECS)
def test_kafka_topics_refuses_partition_by(broker: BrokerProcess, capsys: pytest.CaptureFixture[str], spec: str,
                                           extra: dict[str, str], needles: list[str]) -> None:
    t = unique()
    args = ["--create", "--topic", t, "--config", f"{P}enable=true", "--config", f"{PB}={spec}"]
    for k, v in extra.items():
        args += ["--config", f"{k}={v}"]
    code, text = cli(capsys, kafka_topics.main, broker.bootstrap, *args)
    assert code != 0, text
    assert f"Invalid value {spec} for configuration {PB}" in text, text
    for needle in needles:
        assert needle in text, text
    assert cli(capsys, kafka_topics.main, broker.bootstrap, "--list", "--topic", t)[1] == ""

    # the same value set on an existing topic with kafka-configs
    assert cli(capsys, kafka_topics.main, broker.bootstrap, "--create", "--topic", t,
               *itertools.chain.from_iterable(("--config", f"{k}={v}") for k, v in extra.items()))[0] == 0
    code, text = cli(capsys, kafka_configs.main, broker.bootstrap, "--topic", t, "--alter", "--add-config",
                     f"{PB}={spec}")
    assert code != 0 and PB in text and needles[0] in text, text
    code, text = cli(capsys, kafka_configs.main, broker.bootstrap, "--topic", t, "--describe")
    assert PB not in text, "a refused value must not show up as if it applied"


@pytest.mark.parametrize(("spec", "extra", "needles"), BAD_SPECS[:5])
def test_admin_client_refuses_partition_by(broker: BrokerProcess, spec: str, extra: dict[str, str],
                                           needles: list[str]) -> None:
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    t = unique()
    for validate_only in (True, False):
        fs = client.create_topics([NewTopic(t, 1, 1, config={P + "enable": "true", PB: spec, **extra})],
                                  validate_only=validate_only)
        err = admin_error(fs[t])
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert PB in err.str() and spec in err.str() and needles[0] in err.str(), err.str()

    client.create_topics([NewTopic(t, 1, 1, config=extra)])[t].result(timeout=30)
    for validate_only in (True, False):
        err = admin_error(incremental_set(client, t, validate_only, **{P + "enable": "true", PB: spec}))
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert PB in err.str() and needles[0] in err.str(), err.str()
    # the legacy AlterConfigs (whole override set) too
    (fut,) = client.alter_configs([ConfigResource("topic", t, set_config={PB: spec, **extra})]).values()
    err = admin_error(fut)
    assert err.code() == KafkaError.INVALID_CONFIG and PB in err.str(), err.str()
    (fut,) = client.describe_configs([ConfigResource("topic", t)]).values()
    assert PB not in fut.result(timeout=30)  # never set: no value, so not answered


def test_valid_partition_by_end_to_end(broker: BrokerProcess) -> None:
    t = unique("parted")
    spec = "[_kafka_metadata.partition, bucket(_kafka_key, 8), truncate(_kafka_value, 4)]"
    create(broker, t, 2, enable="true", commit_interval_ms="300", convert_value_type="string", partition_by=spec)
    assert produce(broker, t, 300) == 300
    rows = wait_for_table(broker, t, 300)
    assert len({(p, o) for p, o, *_ in rows}) == 300
    tbl = catalog(broker).load_table(f"default.{t}")
    assert [(f.name, str(f.transform)) for f in tbl.spec().fields] == [
        ("_kafka_metadata_partition", "identity"), ("_kafka_key_bucket", "bucket[8]"),
        ("_kafka_value_trunc", "truncate[4]")]
    # with the default converters the value is binary: truncate applies to it too
    t2 = unique("parted")
    create(broker, t2, 1, enable="true", commit_interval_ms="300",
           partition_by="[truncate(_kafka_value, 2), _kafka_metadata.offset]")
    assert produce(broker, t2, 30) == 30
    assert len(wait_for_table(broker, t2, 30)) == 30


# ---- a spec stored before the check existed ---------------------------------------------------------------


def _store_override(b: BrokerProcess, topic: str, key: str, value: str) -> None:
    """Write an override into the stopped broker's topic table, as a broker before these checks accepted it."""
    path = b.data_dir / "__meta" / "topics.json"
    doc = json.loads(path.read_text())
    doc["topics"][topic]["configs"][key] = value
    path.write_text(json.dumps(doc))


def _metrics(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _tables(b: BrokerProcess) -> str:
    out = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _wait_for(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what}: still {value!r} after {timeout}s")


def test_stored_invalid_spec_is_visible_not_fatal(tmp_path: Path) -> None:
    port = free_port()
    b = BrokerProcess(tmp_path / "data", overrides={"automq.table.topic.metrics.port": str(port)})
    b.start()
    try:
        t = "legacyspec"
        create(b, t, 1, enable="true", commit_interval_ms="300", partition_by="[_kafka_metadata.partition]")
        produce(b, t, 20)
        wait_for_table(b, t, 20)
        b.stop()
        bad = "[day(_kafka_metadata.timestamp)]"
        _store_override(b, t, PB, bad)
        b.start()
        produce(b, t, 20, start=20)
        wait_for_table(b, t, 40)  # the broker runs and the table keeps receiving records
        tbl = catalog(b).load_table(f"default.{t}")
        assert [f.name for f in tbl.spec().fields] == ["_kafka_metadata_partition"]  # the old spec stays
        problem = tbl.properties["tabletopic.partition-by.problem"]
        assert bad in problem and "_kafka_metadata.timestamp" in problem and "long" in problem
        text = _tables(b)
        assert f"default.{t}" in text and bad in text and "not applied" in text, text
        assert "[_kafka_metadata.partition]" in text, text  # the spec the table really has
        gauge = f'tabletopic_partition_by_applied{{topic="{t}"}}'
        assert _wait_for("the partition.by gauge", lambda: f"{gauge} 0.0" in _metrics(port))

        # fixing the setting applies it; the problem goes away everywhere
        client = AdminClient({"bootstrap.servers": b.bootstrap})
        incremental_set(client, t, **{PB: "[bucket(_kafka_key, 4)]"}).result(timeout=30)
        produce(b, t, 20, start=40)
        wait_for_table(b, t, 60)
        assert _wait_for("the partition.by gauge", lambda: f"{gauge} 1.0" in _metrics(port))
        tbl = catalog(b).load_table(f"default.{t}")
        assert [f.name for f in tbl.spec().fields] == ["_kafka_key_bucket"]
        assert "tabletopic.partition-by.problem" not in tbl.properties
        assert "not applied" not in _tables(b)
    finally:
        b.stop()


# ---- converter changes against an existing table -----------------------------------------------------------


def _binary_values(b: BrokerProcess, topic: str) -> set[type]:
    tbl = catalog(b).load_table(f"default.{topic}")
    return {type(r["_kafka_value"]) for r in tbl.scan(selected_fields=("_kafka_value",)).to_arrow().to_pylist()}


def test_converter_change_refused_once_the_table_exists(broker: BrokerProcess,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    t = unique("conv")
    create(broker, t, 1, enable="true", commit_interval_ms="300")
    assert produce(broker, t, 10) == 10
    wait_for_table(broker, t, 10)

    code, text = cli(capsys, kafka_configs.main, broker.bootstrap, "--topic", t, "--alter", "--add-config",
                     f"{P}convert.value.type=string")
    assert code != 0, text
    assert f"Invalid value string for configuration {P}convert.value.type" in text, text
    assert f"default.{t}" in text and "_kafka_value column is binary" in text, text
    assert "create a new topic or drop the table" in text, text

    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for key, value, column in ((P + "convert.value.type", "string", "_kafka_value column is binary"),
                               (P + "convert.key.type", "raw", "_kafka_key column is string"),
                               (P + "schema.type", "schemaless", "no column value")):
        for validate_only in (True, False):
            err = admin_error(incremental_set(client, t, validate_only, **{key: value}))
            assert err.code() == KafkaError.INVALID_CONFIG, err
            assert key in err.str() and column in err.str(), err.str()
    (fut,) = client.alter_configs([ConfigResource("topic", t, set_config={
        P + "enable": "true", P + "commit.interval.ms": "300", P + "convert.value.type": "string"})]).values()
    err = admin_error(fut)
    assert err.code() == KafkaError.INVALID_CONFIG and "_kafka_value" in err.str(), err.str()
    (fut,) = client.describe_configs([ConfigResource("topic", t)]).values()
    assert fut.result(timeout=30)[P + "convert.value.type"].value == "raw"

    # unrelated changes still go through, and the table keeps receiving records as before
    incremental_set(client, t, **{P + "commit.interval.ms": "200"}).result(timeout=30)
    assert produce(broker, t, 10, start=10) == 10
    assert len(wait_for_table(broker, t, 20)) == 20
    assert _binary_values(broker, t) == {bytes}

    # a disabled table topic keeps its table: the change is still refused
    incremental_set(client, t, **{P + "enable": "false"}).result(timeout=30)
    err = admin_error(incremental_set(client, t, **{P + "convert.value.type": "string"}))
    assert err.code() == KafkaError.INVALID_CONFIG and "_kafka_value" in err.str(), err.str()

    # a topic re-created under the name of a kept table cannot ask for other column types either
    client.delete_topics([t])[t].result(timeout=30)
    time.sleep(0.5)
    for validate_only in (True, False):
        fs = client.create_topics([NewTopic(t, 1, 1, config={P + "convert.value.type": "string"})],
                                  validate_only=validate_only)
        err = admin_error(fs[t])
        assert err.code() == KafkaError.INVALID_CONFIG and "_kafka_value column is binary" in err.str(), err.str()
    client.create_topics([NewTopic(t, 1, 1, config={P + "enable": "true"})])[t].result(timeout=30)


def test_converter_change_allowed_before_the_table_exists(broker: BrokerProcess) -> None:
    t = unique("conv")
    create(broker, t, 1)  # not a table topic yet: no table
    assert produce(broker, t, 5) == 5
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    incremental_set(client, t, **{P + "convert.value.type": "string"}).result(timeout=30)
    incremental_set(client, t, **{P + "enable": "true", P + "commit.interval.ms": "300",
                                  P + "convert.value.type": "string", P + "convert.key.type": "raw"}
                    ).result(timeout=30)
    assert produce(broker, t, 5, start=5) == 5
    assert len(wait_for_table(broker, t, 10)) == 10
    tbl = catalog(broker).load_table(f"default.{t}")
    assert (str(tbl.schema().find_type("_kafka_value")), str(tbl.schema().find_type("_kafka_key"))) == (
        "string", "binary")
    assert _binary_values(broker, t) == {str}


# ---- upserts and CDC: settings that cannot work together -------------------------------------------------------


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a schema registry URL: the registry converters pass the registry rule and meet the next one."""
    b = BrokerProcess(tmp_path_factory.mktemp("registry") / "data",
                      overrides={"automq.table.topic.schema.registry.url": "http://127.0.0.1:9"})
    b.start()
    yield b
    b.stop()


REFUSED = [
    # (the key named, its value, the settings beside it, why)
    (P + "upsert.enable", "true", {}, "upsert needs identifier columns"),
    (P + "cdc.field", "_cdc.op", {}, "CDC needs identifier columns"),
    (P + "id.columns", "[id]", {P + "upsert.enable": "true"}, "the table has no column id"),  # string columns only
    (P + "id.columns", "[_kafka_metadata]", {P + "upsert.enable": "true"},
     "column _kafka_metadata is a struct, not a primitive column"),
]


@pytest.mark.parametrize(("key", "value", "extra", "why"), REFUSED)
def test_upsert_settings_that_cannot_work_are_refused(registry_broker: BrokerProcess,
                                                      capsys: pytest.CaptureFixture[str], key: str, value: str,
                                                      extra: dict[str, str], why: str) -> None:
    b = registry_broker
    t = unique("ups")
    settings = {P + "enable": "true", **extra, key: value}
    code, text = cli(capsys, kafka_topics.main, b.bootstrap, "--create", "--topic", t,
                     *itertools.chain.from_iterable(("--config", f"{k}={v}") for k, v in settings.items()))
    assert code != 0, text
    assert f"Invalid value {value} for configuration {key}: {why}" in text, text

    client = AdminClient({"bootstrap.servers": b.bootstrap})
    err = admin_error(client.create_topics([NewTopic(t, 1, 1, config=settings)], validate_only=True)[t])
    assert err.code() == KafkaError.INVALID_CONFIG and why in err.str(), err.str()
    client.create_topics([NewTopic(t, 1, 1)])[t].result(timeout=30)
    err = admin_error(incremental_set(client, t, **settings))
    assert err.code() == KafkaError.INVALID_CONFIG and key in err.str() and why in err.str(), err.str()
    (fut,) = client.describe_configs([ConfigResource("topic", t)]).values()
    entry = fut.result(timeout=30).get(key)  # absent when the setting has no value at all
    assert entry is None or entry.source != 1  # not stored (DYNAMIC_TOPIC_CONFIG)
    # the same key over columns the records decide (JSON values flattened) is accepted: checked against the table
    fine = {**settings, P + "id.columns": "[id]", P + "convert.value.type": "json",
            P + "transform.value.type": "flatten"}
    incremental_set(client, t, **fine).result(timeout=30)


# ---- cdc.field: a field whose value is text -----------------------------------------------------------------

CDC_REFUSED = [
    # (cdc.field over the default converters' columns, why)
    ("_kafka_header", "column _kafka_header is a map<string, binary>, not text"),
    ("_kafka_metadata", "column _kafka_metadata is a struct, not text"),
    ("_kafka_header.op", "column _kafka_header is a map<string, binary>: a field path goes through structs only"),
    ("_kafka_key.op", "column _kafka_key is a string: a field path goes through structs only"),
    ("op", "the table has no column op"),
]


@pytest.mark.parametrize(("field", "why"), CDC_REFUSED)
def test_a_cdc_field_that_cannot_hold_an_op_is_refused(broker: BrokerProcess, field: str, why: str) -> None:
    t = unique("cdc")
    settings = {P + "enable": "true", P + "id.columns": "[_kafka_key]", P + "cdc.field": field}
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for validate_only in (True, False):
        err = admin_error(client.create_topics([NewTopic(t, 1, 1, config=settings)], validate_only=validate_only)[t])
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value {field} for configuration {P}cdc.field: {why}" in err.str(), err.str()
    client.create_topics([NewTopic(t, 1, 1)])[t].result(timeout=30)
    err = admin_error(incremental_set(client, t, **settings))
    assert err.code() == KafkaError.INVALID_CONFIG and f"{P}cdc.field" in err.str() and why in err.str(), err.str()
    # a text column (or one cast to text, as the partition here) is accepted
    incremental_set(client, t, True, **{**settings, P + "cdc.field": "_kafka_metadata.partition"}).result(timeout=30)


def test_a_cdc_field_checked_against_the_existing_table(broker: BrokerProcess) -> None:
    """Columns the records decide (JSON flattened): the table the records made is what counts (and its rows, written
    as appends, keep CDC off: test_upserts_turned_on_over_appended_rows_are_refused)."""
    t = unique("cdc")
    create(broker, t, 1, enable="true", commit_interval_ms="300", convert_value_type="json",
           transform_value_type="flatten")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(t, key=b"k", value=json.dumps({"id": 1, "op": {"code": "D"}, "kind": "delete"}).encode())
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while True:
        tbl = catalog(broker).load_table(f"default.{t}") if catalog(broker).table_exists(f"default.{t}") else None
        if tbl is not None and "op" in tbl.schema().column_names and tbl.current_snapshot() is not None:
            break
        assert time.monotonic() < deadline, "no table with an op column and the row"
        time.sleep(0.2)
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for validate_only in (True, False):
        err = admin_error(incremental_set(client, t, validate_only, **{P + "id.columns": "[id]",
                                                                       P + "cdc.field": "op"}))
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value op for configuration {P}cdc.field: the table default.{t} already exists and " \
               "column op is a struct, not text" in err.str(), err.str()
    # text fields pass the column check; this table's rows were appended, though, so CDC is not turned on for it
    for field in ("op.code", "kind"):
        err = admin_error(incremental_set(client, t, True, **{P + "id.columns": "[id]", P + "cdc.field": field}))
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value {field} for configuration {P}cdc.field: the table default.{t} already exists and it " \
               "holds 1 row written as appends" in err.str(), err.str()


# ---- iceberg.auto-create.properties: applied as given, or refused ------------------------------------------

AC = P + "iceberg.auto-create.properties"
AUTO_CREATE_REFUSED = [
    # (the auto-create properties, other settings, why)
    ("format-version=1", {}, "format-version=1: a table topic's table is format version 2 or 3"),
    ("format-version=4", {}, "format-version=4: a table topic's table is format version 2 or 3"),
    ("tabletopic.offsets={\"0\":100}", {}, "tabletopic.offsets: tabletopic.* properties are the broker's own"),
    ("write.merge.mode=copy-on-write", {P + "upsert.enable": "true", P + "id.columns": "[_kafka_key]"},
     "write.merge.mode=copy-on-write: an upsert/CDC table"),
    ("format-version=3,write.wap.enabled=false", {P + "cdc.field": "_kafka_key", P + "id.columns": "[_kafka_key]"},
     "write.wap.enabled=false: an upsert/CDC table"),
]


@pytest.mark.parametrize(("props", "extra", "why"), AUTO_CREATE_REFUSED)
def test_auto_create_properties_that_would_be_overridden_are_refused(broker: BrokerProcess, props: str,
                                                                      extra: dict[str, str], why: str) -> None:
    t = unique("ac")
    settings = {P + "enable": "true", **extra, AC: props}
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for validate_only in (True, False):
        err = admin_error(client.create_topics([NewTopic(t, 1, 1, config=settings)], validate_only=validate_only)[t])
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value {props} for configuration {AC}: {why}" in err.str(), err.str()
    client.create_topics([NewTopic(t, 1, 1)])[t].result(timeout=30)
    err = admin_error(incremental_set(client, t, **settings))
    assert err.code() == KafkaError.INVALID_CONFIG and AC in err.str() and why in err.str(), err.str()


def test_a_format_version_the_existing_table_is_not_is_refused(broker: BrokerProcess) -> None:
    """Auto-create properties apply when the table is created: asking an existing format v2 table for format 3 is
    refused (never a v2 table while the settings say 3); the version it is, or none, is accepted."""
    t = unique("fv")
    create(broker, t, 1, enable="true", commit_interval_ms="300", convert_value_type="string")
    assert produce(broker, t, 5) == 5
    wait_for_table(broker, t, 5)
    assert catalog(broker).load_table(f"default.{t}").metadata.format_version == 2
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for validate_only in (True, False):
        err = admin_error(incremental_set(client, t, validate_only, **{AC: "format-version=3"}))
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value format-version=3 for configuration {AC}: the table default.{t} already exists and " \
               "it is format version 2, not 3" in err.str(), err.str()
    incremental_set(client, t, **{AC: "format-version=2,write.parquet.compression-codec=snappy"}).result(timeout=30)
    incremental_set(client, t, **{AC: "write.parquet.compression-codec=snappy"}).result(timeout=30)


# ---- names that would move a table's files (issue 22 item 6) ------------------------------------------------

NS = P + "namespace"


@pytest.mark.parametrize(("namespace", "why"), [("x/y", "'/' (a path separator)"),
                                                ("../../x", "'/' (a path separator)"),
                                                ("x..y", "an empty level")])
def test_namespaces_that_would_move_the_table_are_refused(broker: BrokerProcess, capsys: pytest.CaptureFixture[str],
                                                          namespace: str, why: str) -> None:
    """INVALID_CONFIG naming key and value, at creation (validate-only too) and when altered, through confluent-kafka
    and the project's kafka-topics; ``../../x`` reached the catalog and came back as UNKNOWN_SERVER_ERROR."""
    t = unique("ns")
    settings = {P + "enable": "true", NS: namespace}
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for validate_only in (True, False):
        err = admin_error(client.create_topics([NewTopic(t, 1, 1, config=settings)], validate_only=validate_only)[t])
        assert err.code() == KafkaError.INVALID_CONFIG, err
        assert f"Invalid value {namespace} for configuration {NS}: it " in err.str() and why in err.str(), err.str()
    code, text = cli(capsys, kafka_topics.main, broker.bootstrap, "--create", "--topic", t, "--config",
                     f"{NS}={namespace}")
    assert code != 0 and f"Invalid value {namespace} for configuration {NS}" in text, text
    client.create_topics([NewTopic(t, 1, 1)])[t].result(timeout=30)
    err = admin_error(incremental_set(client, t, **settings))
    assert err.code() == KafkaError.INVALID_CONFIG and f"{NS}: it " in err.str() and why in err.str(), err.str()


# ---- changes of the value layout and of upserts on an existing table (issue 22 item 9) -----------------------


def _wait_for_column(b: BrokerProcess, topic: str, column: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        cat = catalog(b)
        if cat.table_exists(("default", topic)) and column in cat.load_table(("default", topic)).schema().column_names:
            return
        assert time.monotonic() < deadline, f"no column {column} in default.{topic}"
        time.sleep(0.2)


def test_a_transform_that_would_lay_the_values_out_otherwise_is_refused(broker: BrokerProcess) -> None:
    """flatten → none on a flattened table would start a _kafka_value column beside the value's columns, none →
    flatten the value's fields beside _kafka_value: refused once the table has value columns (before, accepted)."""
    flat, plain = unique("flat"), unique("plain")
    json_value = {P + "enable": "true", P + "commit.interval.ms": "300", P + "convert.value.type": "json"}
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in client.create_topics([NewTopic(flat, 1, 1, config={**json_value, P + "transform.value.type": "flatten"}),
                                     NewTopic(plain, 1, 1, config=json_value)]).values():
        fut.result(timeout=30)
    _wait_for_column(broker, plain, "_kafka_metadata")
    # no value column yet (the records decide it): any transform is accepted
    incremental_set(client, plain, True, **{P + "transform.value.type": "flatten"}).result(timeout=30)
    produce(broker, flat, 3)
    produce(broker, plain, 3)
    _wait_for_column(broker, flat, "amount")
    _wait_for_column(broker, plain, "_kafka_value")
    for topic, value, have in ((flat, "none", "flattened into top-level columns"),
                               (plain, "flatten", "in its _kafka_value column")):
        for validate_only in (True, False):
            err = admin_error(incremental_set(client, topic, validate_only, **{P + "transform.value.type": value}))
            assert err.code() == KafkaError.INVALID_CONFIG, err
            assert (f"Invalid value {value} for configuration {P}transform.value.type: the table default.{topic} "
                    f"already exists and its values are {have}") in err.str(), err.str()
            assert "(id, name, amount)" in err.str() or topic == plain, err.str()
            assert "does not change an existing table's column layout. Create a new topic" in err.str(), err.str()
    assert "_kafka_value" not in catalog(broker).load_table(("default", flat)).schema().column_names
    # a topic created over the kept table cannot ask for another layout either
    client.delete_topics([flat])[flat].result(timeout=30)
    time.sleep(0.5)
    err = admin_error(client.create_topics([NewTopic(flat, 1, 1, config=json_value)])[flat])
    assert err.code() == KafkaError.INVALID_CONFIG and "flattened into top-level columns" in err.str(), err.str()


def test_upserts_turned_on_over_appended_rows_are_refused(broker: BrokerProcess) -> None:
    """upsert.enable (or cdc.field) on a table holding appended rows would leave a key's several rows for good:
    refused, also after upserts were turned off and rows appended, and for a topic created over such a table;
    turning upserts off is accepted (the table becomes an append table), as is turning them on while the table is
    empty."""
    t = unique("ups")
    keyed = {P + "id.columns": "[_kafka_key]"}
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    create(broker, t, 1, enable="true", commit_interval_ms="300", convert_value_type="string", upsert_enable="true",
           id_columns="[_kafka_key]")
    _wait_for_column(broker, t, "_kafka_value")  # created empty: nothing merged, no Spark needed
    incremental_set(client, t, **{P + "upsert.enable": "false"}).result(timeout=30)  # off: accepted
    incremental_set(client, t, True, **{P + "upsert.enable": "true"}).result(timeout=30)  # still empty
    assert produce(broker, t, 4) == 4
    wait_for_table(broker, t, 4)
    tbl = catalog(broker).load_table(("default", t))
    assert tbl.properties["tabletopic.rows-appended"] == "true"
    for key, value in ((P + "upsert.enable", "true"), (P + "cdc.field", "_kafka_value")):
        for validate_only in (True, False):
            err = admin_error(incremental_set(client, t, validate_only, **keyed, **{key: value}))
            assert err.code() == KafkaError.INVALID_CONFIG, err
            assert (f"Invalid value {value} for configuration {key}: the table default.{t} already exists and it "
                    f"holds 4 rows written as appends") in err.str(), err.str()
            assert "Use a new topic" in err.str() and "enable=false, drop the table" in err.str(), err.str()
    (fut,) = client.describe_configs([ConfigResource("topic", t)]).values()
    assert fut.result(timeout=30)[P + "upsert.enable"].value == "false"
    # a topic created again over the kept table
    client.delete_topics([t])[t].result(timeout=30)
    time.sleep(0.5)
    settings = {P + "enable": "true", P + "convert.value.type": "string", P + "upsert.enable": "true", **keyed}
    err = admin_error(client.create_topics([NewTopic(t, 1, 1, config=settings)])[t])
    assert err.code() == KafkaError.INVALID_CONFIG and "rows written as appends" in err.str(), err.str()


def test_value_layouts_told_apart_by_the_table_columns(tmp_path: Path) -> None:
    """The layouts a table can hold its values in, by its columns (a real SQLite catalog; flatten_debezium needs a
    schema registry, so not end to end here): _kafka_value (none), top-level columns (flatten), top-level columns
    beside _cdc (flatten_debezium), the legacy key/value/timestamp; a table without value columns takes any."""
    from pyiceberg.types import IcebergType, LongType, NestedField, StringType, StructType

    from configs.table_schema import table_schema
    from configs.table_topic import ConvertType, SchemaType, TableTopicConfig, TransformType
    from coordinator.table import value_layout_conflict
    from tabletopic.catalog import broker_config, load_catalog

    cat = load_catalog(broker_config(None, {"log.dirs": str(tmp_path)}), create=True)
    assert cat is not None
    cat.create_namespace("default")
    json_cfg = TableTopicConfig(namespace="default", convert_value_type=ConvertType.JSON)
    configs = {"none": json_cfg, "flatten": replace(json_cfg, transform_value_type=TransformType.FLATTEN),
               "flatten_debezium": replace(json_cfg, convert_value_type=ConvertType.BY_SCHEMA_ID,
                                           transform_value_type=TransformType.FLATTEN_DEBEZIUM),
               "legacy": TableTopicConfig(namespace="default", schema_type=SchemaType.SCHEMALESS,
                                          convert_value_type=ConvertType.STRING)}
    fixed = list(table_schema(json_cfg).fields)
    top = 1000
    cdc = StructType(NestedField(999, "op", StringType()))
    extra: dict[str, list[tuple[str, IcebergType]]] = {
        "empty": [], "none": [("_kafka_value", StringType())], "flatten": [("id", LongType())],
        "flatten_debezium": [("id", LongType()), ("_cdc", cdc)]}
    for name, columns in extra.items():
        fields = [*fixed, *(NestedField(top + i, c, t, required=False) for i, (c, t) in enumerate(columns))]
        cat.create_table(("default", name), Schema(*fields))
    cat.create_table(("default", "legacy"), table_schema(configs["legacy"]))
    for table in ("empty", *extra, "legacy"):
        for layout, cfg in configs.items():
            _, problem = value_layout_conflict(cat, table, cfg, None)
            assert (problem is None) == (table in ("empty", layout)), (table, layout, problem)
            assert value_layout_conflict(cat, table, cfg, cfg)[1] is None, "no change: the table is not read"
    _, problem = value_layout_conflict(cat, "flatten_debezium", configs["flatten"], None)
    assert problem is not None and problem.startswith("its values are Debezium rows in top-level columns beside "
                                                      "_cdc (id, _cdc); with flatten they would be flattened"), problem


# ---- a table topic's table and another's dead-letter table -----------------------------------------------------

def test_a_table_topic_cannot_take_another_ones_dead_letter_table(broker: BrokerProcess) -> None:
    """Table topic ``x`` keeps its dead letters in table ``x_dlq``: a table topic ``x_dlq`` in the same namespace
    (created, or turned on later) would write into that table and folder, and the two tables' orphan removal would
    delete each other's files. Refused either way round with INVALID_CONFIG; in another namespace it is fine."""
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    base = unique("dlqname").replace("-", "_")
    on = {P + "enable": "true"}
    client.create_topics([NewTopic(base, 1, 1, config=on)])[base].result(timeout=30)
    err = admin_error(client.create_topics([NewTopic(f"{base}_dlq", 1, 1, config=on)])[f"{base}_dlq"])
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert f"default.{base}_dlq" in err.str() and f"table topic {base} " in err.str(), err.str()
    # a plain topic of that name is fine, turning it into a table topic is not
    client.create_topics([NewTopic(f"{base}_dlq", 1, 1)])[f"{base}_dlq"].result(timeout=30)
    err = admin_error(incremental_set(client, f"{base}_dlq", **{P + "enable": "true"}))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    incremental_set(client, f"{base}_dlq", **{P + "enable": "true", P + "namespace": "elsewhere"}).result(timeout=30)
    # the other way round: the dead-letter table of a new table topic is an existing table topic's table
    other = f"{base}2"
    client.create_topics([NewTopic(f"{other}_dlq", 1, 1, config=on)])[f"{other}_dlq"].result(timeout=30)
    err = admin_error(client.create_topics([NewTopic(other, 1, 1, config=on)])[other])
    assert err.code() == KafkaError.INVALID_CONFIG and f"default.{other}_dlq" in err.str(), err.str()
