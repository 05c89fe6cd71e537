"""The broker's Spark side process (tabletopic.spark.service): real child process, real Spark, real catalog.

One service for the module (a JVM start costs seconds); the restart tests start it again on purpose. No broker:
the catalog and tables are created with pyiceberg as the broker does, and read back with pyiceberg.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimeType,
    UUIDType,
)

from configs.admin import describe_broker
from configs.model import BrokerConfig
from tabletopic.catalog import load_catalog
from tabletopic.errors import InvalidConfigError
from tabletopic.spark import (
    SparkOperationError,
    SparkService,
    SparkServiceError,
    SparkServiceTimeoutError,
    heap_mib,
    read_status,
    spark_conf,
)
from tests.test_query_catalog import losing_next_commit, shipped_properties

ROOT = Path(__file__).resolve().parent.parent
IDLE_STOP = "table.topic.spark.idle.stop.ms"
DRIVER_MEMORY = "768m"  # not the default: the test sees it reach the JVM
# a Spark statement that runs for a while (a static Java method called from SQL)
SLOW_SQL = "SELECT reflect('java.lang.Thread', 'sleep', CAST(60000 AS BIGINT))"


def _opt(field_id: int, name: str, field_type: Any) -> NestedField:
    return NestedField(field_id, name, field_type, required=False)


# the table's schema before evolution: a top-level struct, a list of structs, a map of structs, types to widen
BASE = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    _opt(2, "f", FloatType()),
    _opt(3, "d", DecimalType(9, 2)),
    _opt(4, "s", StructType(_opt(5, "a", StringType()))),
    _opt(6, "l", ListType(7, StructType(_opt(8, "x", IntegerType())), element_required=False)),
    _opt(9, "m", MapType(10, StringType(), 11, StructType(_opt(12, "y", IntegerType())), value_required=False)),
    _opt(13, "keep", StringType()),
    _opt(14, "big", LongType()),
)

# a record's schema (ids are the record's own: the union matches by name): widened types, new nested fields,
# "keep" missing, "big" narrower, new uuid/time/fixed columns, a new required column
EVOLVED = Schema(
    _opt(1, "id", LongType()),
    _opt(2, "f", DoubleType()),
    _opt(3, "d", DecimalType(18, 2)),
    _opt(4, "s", StructType(_opt(5, "a", StringType()), _opt(6, "b", LongType()))),
    _opt(7, "l", ListType(8, StructType(_opt(9, "x", IntegerType()), _opt(10, "x2", StringType())),
                          element_required=False)),
    _opt(11, "m", MapType(12, StringType(), 13, StructType(_opt(14, "y", IntegerType()), _opt(15, "y2", BooleanType())),
                          value_required=False)),
    _opt(16, "big", IntegerType()),
    _opt(17, "u", UUIDType()),
    _opt(18, "tm", TimeType()),
    _opt(19, "fx", FixedType(4)),
    NestedField(20, "req", StringType(), required=True),
)


@dataclass
class Env:
    root: Path
    props: dict[str, str]
    config: BrokerConfig
    catalog: Catalog


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("spark-service")
    props = {**shipped_properties(root), "spark.driver.memory": DRIVER_MEMORY,
             "spark.sql.shuffle.partitions": "3", "spark.sql.session.timeZone": "UTC",
             "spark.sql.caseSensitive": "false"}
    config = BrokerConfig.from_properties(props)
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    catalog.create_namespace_if_not_exists("default")
    return Env(root, props, config, catalog)


@pytest.fixture(scope="module")
def service(env: Env) -> Iterator[SparkService]:
    s = SparkService(env.config, start_timeout_s=240, call_timeout_s=120)
    yield s
    s.close()


def alive(pid: int | None) -> bool:
    """The process runs (a zombie waiting for its reaper counts as gone)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(b")", 1)[-1].split()[0] != b"Z"


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def in_flight(service: SparkService, statement: str) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``statement`` in a thread; returns once the child is running it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.sql(statement, timeout=120)
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: service.state == "running" and service.busy, 60, "the call in flight")
    time.sleep(1.5)  # the request reached the child and Spark runs it (the statement takes a minute)
    return thread, errors


# ---- settings (no JVM) ----


def test_spark_settings_reach_the_session_conf(tmp_path: Path) -> None:
    config = BrokerConfig.from_properties({**shipped_properties(tmp_path), "spark.executor.cores": "2",
                                           "spark.sql.shuffle.partitions": "7"})
    assert config.spark_master == "local[4]" and config.spark_driver_memory == "1g"  # the stated defaults
    assert config.spark_idle_stop_ms == 600_000  # ten minutes
    assert config.spark_settings == {"spark.master": "local[4]", "spark.driver.memory": "1g",
                                     "spark.executor.cores": "2", "spark.sql.shuffle.partitions": "7"}
    conf = spark_conf(config)
    assert conf["spark.master"] == "local[4]" and conf["spark.driver.memory"] == "1g"
    assert conf["spark.executor.cores"] == "2"
    assert conf["spark.sql.shuffle.partitions"] == "7"  # a broker setting wins over the built-in default
    assert conf["spark.sql.catalog.tabletopic.type"] == "jdbc"  # the catalog wiring is still there
    assert not any("idle" in key for key in conf)  # tabletopic's own setting stays with the broker
    # the JVM tuning for many small queries is a default a broker setting replaces, and the log4j file stays
    # (with the driver's heap at its full size from the start: spark.driver.memory's)
    assert conf["spark.driver.defaultJavaOptions"] == "-XX:+UseSerialGC -Xms1024m"
    assert spark_conf(config, driver_memory="512m")["spark.driver.defaultJavaOptions"].endswith(" -Xms512m")
    assert [heap_mib(m) for m in ("1g", "2G", "1536m", "2gb", "4096", "8k", "lots")] == [
        1024, 2048, 1536, 2048, 4096, None, None]
    assert conf["spark.sql.codegen.wholeStage"] == "false"
    tuned = spark_conf(BrokerConfig.from_properties({**shipped_properties(tmp_path),
                                                     "spark.driver.defaultJavaOptions": "-XX:+UseG1GC",
                                                     "spark.sql.codegen.wholeStage": "true"}))
    assert tuned["spark.driver.defaultJavaOptions"] == "-XX:+UseG1GC"
    assert tuned["spark.sql.codegen.wholeStage"] == "true"
    assert "log4j2.configurationFile" in tuned["spark.driver.extraJavaOptions"]
    # explicit arguments (`tabletopic sql --driver-memory`) win over the broker's settings
    assert spark_conf(config, master="local[1]", driver_memory="2g")["spark.driver.memory"] == "2g"
    cluster = BrokerConfig.from_properties({**shipped_properties(tmp_path), "spark.master": "spark://127.0.0.1:7077",
                                            "spark.driver.memory": "2G"})
    assert spark_conf(cluster)["spark.master"] == "spark://127.0.0.1:7077"
    assert spark_conf(cluster)["spark.driver.memory"] == "2G"
    entries = {e.name: e for e in describe_broker(config, ["spark.master", "spark.executor.cores"])}
    assert entries["spark.master"].value == "local[4]"
    assert entries["spark.executor.cores"].doc == "Passed through to the Spark session."


@pytest.mark.parametrize(("key", "value"), [("spark.driver.memory", "lots"), ("spark.driver.memory", "0"),
                                            ("spark.driver.memory", "1.5g"), ("spark.master", " "),
                                            (IDLE_STOP, "-1"), (IDLE_STOP, "10m")])
def test_bad_spark_settings_are_refused(key: str, value: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(f"Invalid value {value.strip()} for configuration {key}: ")):
        BrokerConfig.from_properties({key: value})


def test_a_broker_with_a_bad_idle_stop_does_not_start(tmp_path: Path) -> None:
    """Refused at start, before anything is written: one line naming the setting, exit code 2."""
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "serve", "--override", f"log.dirs={tmp_path / 'd'}",
                           "--override", f"{IDLE_STOP}=-5"], check=False, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert f"error: Invalid value -5 for configuration {IDLE_STOP}: Value must be at least 0" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "d").exists()


def test_a_start_failure_is_reported_and_retried_with_backoff(tmp_path: Path) -> None:
    """No catalog where the settings point: the child reports it (before starting a JVM), the call fails with
    the reason, the state says so, and a call inside the backoff fails at once without starting anything."""
    config = BrokerConfig.from_properties(shipped_properties(tmp_path))
    service = SparkService(config, start_timeout_s=60)
    try:
        assert service.state == "not started"
        with pytest.raises(SparkServiceError, match="could not start: CatalogNotFoundError: no catalog at"):
            service.ping()
        assert service.state == "restarting"
        assert (service.last_failure or "").startswith("start failed: CatalogNotFoundError")
        assert service.pid is None
        status = read_status(config.log_dir)  # what `tabletopic tables` reads
        assert status is not None and status["state"] == "restarting" and status["failures"] == 1
        assert status["last_failure"] == service.last_failure and status["next_start_at"] > time.time()
        t0 = time.monotonic()
        with pytest.raises(SparkServiceError, match=r"next start in \d+ s"):
            service.ping(timeout=0.1)
        assert time.monotonic() - t0 < 1.0
        assert service.restarts == 0
    finally:
        service.close()
    assert service.state == "stopped"


# ---- schema evolution ----


def test_evolve_schema_applies_the_union(env: Env, service: SparkService) -> None:
    table = env.catalog.create_table("default.evolve", BASE, properties={"format-version": "2"})
    row = {"id": 1, "f": 1.5, "d": Decimal("1.25"), "s": {"a": "x"}, "l": [{"x": 2}], "m": [("k", {"y": 3})],
           "keep": "kept", "big": 1 << 40}
    table.append(pa.Table.from_pylist([row], schema=schema_to_pyarrow(table.schema())))
    old_names = ("id", "s.a", "l.element.x", "m.value.y", "keep", "big")
    old_ids = [table.schema().find_field(n).field_id for n in old_names]

    schema_id = service.evolve_schema("default.evolve", EVOLVED.model_dump_json())

    table = env.catalog.load_table("default.evolve")
    schema = table.schema()
    assert schema_id == schema.schema_id == 1
    fields = {name: schema.find_field(name) for name in (
        "id", "f", "d", "s.a", "s.b", "l.element.x", "l.element.x2", "m.value.y", "m.value.y2", "keep", "big",
        "u", "tm", "fx", "req")}
    assert {name: (f.field_type, f.required) for name, f in fields.items()} == {
        "id": (LongType(), False),  # int → long, and required → optional
        "f": (DoubleType(), False),
        "d": (DecimalType(18, 2), False),
        "s.a": (StringType(), False),
        "s.b": (LongType(), False),  # new field inside a struct
        "l.element.x": (IntegerType(), False),
        "l.element.x2": (StringType(), False),  # ... inside a list's element struct
        "m.value.y": (IntegerType(), False),
        "m.value.y2": (BooleanType(), False),  # ... inside a map's value struct
        "keep": (StringType(), False),  # missing from the record's schema: kept
        "big": (LongType(), False),  # narrower in the record's schema: left as it is
        "u": (UUIDType(), False),
        "tm": (TimeType(), False),
        "fx": (FixedType(4), False),
        "req": (StringType(), False),  # a new required field is added as optional
    }
    # existing fields keep their ids; new ones get fresh ids
    assert [fields[n].field_id for n in old_names] == old_ids
    assert min(fields[n].field_id for n in ("s.b", "l.element.x2", "m.value.y2", "u", "tm", "fx", "req")) > max(
        BASE.highest_field_id, *old_ids)
    # the row written before reads back through the new schema: promoted values, nulls in the new columns
    [back] = table.scan().to_arrow().to_pylist()
    assert back["id"] == 1 and back["f"] == 1.5 and back["d"] == Decimal("1.25") and back["big"] == 1 << 40
    assert back["s"] == {"a": "x", "b": None} and back["l"] == [{"x": 2, "x2": None}]
    assert back["m"] == [("k", {"y": 3, "y2": None})]
    assert back["keep"] == "kept" and back["u"] is None and back["tm"] is None and back["fx"] is None

    # the same union again changes nothing and commits nothing
    location = table.metadata_location
    assert service.evolve_schema(("default", "evolve"), EVOLVED.model_dump_json()) == 1
    assert env.catalog.load_table("default.evolve").metadata_location == location


def test_a_refused_change_is_an_operation_error(env: Env, service: SparkService) -> None:
    """Type changes Iceberg cannot apply are refused, with nothing committed; the process goes on."""
    env.catalog.create_table("default.refused", BASE, properties={"format-version": "2"})
    pid = service.pid
    cases = [(_opt(1, "id", StringType()), "Cannot change column type: id: int -> string"),
             (_opt(3, "d", DecimalType(18, 3)), "Cannot change column type: d: decimal(9, 2) -> decimal(18, 3)"),
             (_opt(4, "s", StringType()), "Cannot change column type: s: struct")]
    for field, message in cases:
        with pytest.raises(SparkOperationError) as info:
            service.evolve_schema("default.refused", Schema(field).model_dump_json())
        assert info.value.kind == "java.lang.IllegalArgumentException"
        assert info.value.message.startswith(message), info.value.message
    assert env.catalog.load_table("default.refused").schema().schema_id == 0
    with pytest.raises(SparkOperationError, match="NoSuchTableException"):
        service.evolve_schema("default.missing", BASE.model_dump_json())
    assert service.state == "running" and service.pid == pid and service.restarts == 0


def test_a_lost_schema_commit_is_redone(env: Env, service: SparkService) -> None:
    """The catalog's compare-and-set refuses the first schema commit (as when the broker committed a round in
    between): the union is redone on the refreshed table. A table name with a dash needs no quoting."""
    env.catalog.create_table("default.lost-commit", BASE, properties={"format-version": "2"})
    with losing_next_commit(env.config) as lost:
        schema_id = service.evolve_schema(("default", "lost-commit"), Schema(_opt(1, "extra", LongType()))
                                          .model_dump_json())
        assert lost()  # the conflict happened
    schema = env.catalog.load_table("default.lost-commit").schema()
    assert schema_id == schema.schema_id == 1
    assert schema.find_field("extra").field_type == LongType()


# ---- sql, settings in the session ----


def test_sql_returns_plain_rows_with_the_brokers_spark_settings(env: Env, service: SparkService) -> None:
    rows = service.sql("SELECT 1 AS a, named_struct('x', 2, 'y', array(1, 2)) AS s, map('k', 1.5D) AS m, "
                       "X'00FF' AS b")
    assert rows == [(1, (2, [1, 2]), {"k": 1.5}, b"\x00\xff")]
    assert all(type(r) is tuple and type(r[1]) is tuple for r in rows)  # no pyspark Row in the broker
    assert service.sql("SET spark.sql.shuffle.partitions") == [("spark.sql.shuffle.partitions", "3")]
    assert service.sql("SET spark.sql.session.timeZone") == [("spark.sql.session.timeZone", "UTC")]
    # ... except what the operations need: column names told apart by case, as Iceberg does (Dup is not dup)
    assert service.sql("SET spark.sql.caseSensitive") == [("spark.sql.caseSensitive", "true")]
    # a Spark limitation, not the service's: Spark SQL cannot read a table with a time column at all
    with pytest.raises(SparkOperationError, match="Spark does not support time fields"):
        service.sql("SELECT count(*) FROM default.evolve")
    with pytest.raises(SparkOperationError) as info:
        service.sql("SELECT id FROM range(5)", max_rows=3)
    assert info.value.kind == "ValueError" and "more than 3 rows" in info.value.message
    with pytest.raises(SparkOperationError, match="TABLE_OR_VIEW_NOT_FOUND"):
        service.sql("SELECT * FROM default.nope")
    # the driver JVM's heap is spark.driver.memory
    cmdline = Path(f"/proc/{service.jvm_pid}/cmdline").read_bytes().split(b"\0")
    assert f"-Xmx{DRIVER_MEMORY}".encode() in cmdline
    assert service.state == "running" and service.restarts == 0


# ---- failures and restarts ----


def test_kill_9_of_the_child_fails_the_call_and_the_next_call_restarts_it(service: SparkService) -> None:
    service.ping()
    pid, jvm = service.pid, service.jvm_pid
    assert pid is not None and alive(jvm)
    thread, errors = in_flight(service, SLOW_SQL)
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], SparkServiceError), errors
    assert "was killed by SIGKILL" in str(errors[0]) and str(service.log_path) in str(errors[0])
    assert service.state == "restarting" and service.last_failure == "was killed by SIGKILL"
    wait_for(lambda: not alive(jvm), 15, "the JVM exits after its process")

    service.ping()
    assert service.state == "running" and service.restarts == 1
    assert service.pid not in (None, pid) and alive(service.jvm_pid)


def test_a_child_that_dies_between_calls_is_seen_at_once(env: Env, service: SparkService) -> None:
    """No call in flight: the watcher notices the death, the state (and the status file) say ``restarting`` with
    the reason before any call; the next call starts it again (a restart)."""
    service.ping()
    pid, jvm, restarts = service.pid, service.jvm_pid, service.restarts
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (read_status(env.config.log_dir) or {}).get("state") == "restarting", 10,
             "the death seen without a call")
    assert service.state == "restarting" and service.last_failure == "was killed by SIGKILL" and service.pid is None
    status = read_status(env.config.log_dir)
    assert status is not None and status["last_failure"] == "was killed by SIGKILL" and status["pid"] is None
    assert status["next_start_at"] - status["last_failure_at"] == pytest.approx(1.0, abs=0.1)  # the first backoff
    wait_for(lambda: not alive(jvm), 15, "the JVM exits after its process")
    service.ping()
    assert service.state == "running" and service.restarts == restarts + 1


def test_a_jvm_crash_fails_the_call_and_the_next_call_restarts(service: SparkService) -> None:
    service.ping()
    pid, jvm = service.pid, service.jvm_pid
    restarts = service.restarts
    assert jvm is not None
    thread, errors = in_flight(service, SLOW_SQL)
    os.kill(jvm, signal.SIGKILL)
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], SparkServiceError), errors
    assert "exited with code 3" in str(errors[0]) and service.state == "restarting"
    assert service.last_failure == "exited with code 3: its driver JVM died"
    assert not alive(pid)
    service.ping()
    assert service.state == "running" and service.restarts == restarts + 1


def test_a_call_over_its_timeout_stops_the_process(service: SparkService) -> None:
    service.ping()
    pid, jvm, restarts = service.pid, service.jvm_pid, service.restarts
    t0 = time.monotonic()
    with pytest.raises(SparkServiceTimeoutError, match="sql timed out after 1 s"):
        service.sql(SLOW_SQL, timeout=1)
    assert time.monotonic() - t0 < 20
    assert service.state == "restarting" and service.last_failure == "sql timed out after 1 s"
    assert not alive(pid)
    wait_for(lambda: not alive(jvm), 15, "the JVM exits after its process")
    service.ping()
    assert service.state == "running" and service.restarts == restarts + 1


def test_the_log_file_has_one_line_per_message(service: SparkService) -> None:
    lines = [ln for ln in service.log_path.read_text().splitlines() if ln.strip()]
    assert any("starting Spark" in ln for ln in lines)
    assert any("Spark driver JVM" in ln and ln.endswith(": exiting") for ln in lines)  # the JVM crash above
    odd = [ln for ln in lines if not ln[:2].isdigit()]  # every line starts with its time stamp
    assert not odd, odd


def test_the_child_and_its_jvm_exit_when_the_broker_dies(env: Env) -> None:
    """kill -9 of the broker while the child is busy with a call (so it is not waiting on the connection)."""
    script = ("import json, sys, threading, time\n"
              "from configs.model import BrokerConfig\n"
              "from tabletopic.spark import SparkService\n"
              "s = SparkService(BrokerConfig.from_properties(json.loads(sys.argv[1])), start_timeout_s=240)\n"
              "s.ping()\n"
              f"threading.Thread(target=s.sql, args=({SLOW_SQL!r},)).start()\n"
              "time.sleep(1.5)\n"
              "print(s.pid, s.jvm_pid, flush=True)\n"
              "time.sleep(600)\n")
    props = {**env.props, "log.dirs": str(env.root / "data")}
    broker = subprocess.Popen([sys.executable, "-c", script, json.dumps(props)], cwd=ROOT, stdout=subprocess.PIPE)
    pids: list[int] = []
    try:
        assert broker.stdout is not None
        ready, _, _ = select.select([broker.stdout], [], [], 240)
        assert ready, "the service did not start"
        pids = [int(p) for p in broker.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        broker.kill()
        broker.wait()
        wait_for(lambda: not any(alive(p) for p in pids), 15, "the child and its JVM exit after the broker")
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_idle_process_is_stopped_and_started_again_by_the_next_call(env: Env) -> None:
    """``table.topic.spark.idle.stop.ms``: the child and its JVM stop after that long without a call (a call
    running longer is never cut), the state says ``stopped idle``, and the next call starts them again (a start,
    not a restart after a failure)."""
    config = BrokerConfig.from_properties({**env.props, IDLE_STOP: "1500"})
    service = SparkService(config, log_path=env.root / "idle" / "spark-service.log", start_timeout_s=240)
    try:
        assert read_status(env.root / "idle") is not None  # the status file is there before any start
        t0 = time.monotonic()
        # runs for 3 s, twice the idle time: the watcher leaves a busy process alone
        service.sql("SELECT reflect('java.lang.Thread', 'sleep', CAST(3000 AS BIGINT))")
        pid, jvm = service.pid, service.jvm_pid
        assert service.state == "running" and alive(pid) and alive(jvm)
        wait_for(lambda: service.state == "stopped idle", 30, "the idle stop")
        assert time.monotonic() - t0 > 1.5
        assert service.pid is None and not alive(pid) and not alive(jvm)
        # the state is set in memory a moment before the status file is written (by the watcher thread)
        wait_for(lambda: (read_status(env.root / "idle") or {}).get("state") == "stopped idle", 10, "the status file")
        status = read_status(env.root / "idle")
        assert status is not None and status["state"] == "stopped idle" and status["idle_stops"] == 1
        assert status["starts"] == 1 and status["restarts"] == 0 and status["failures"] == 0

        service.ping()  # started again, lazily
        assert service.state == "running" and service.pid not in (None, pid) and alive(service.jvm_pid)
        status = read_status(env.root / "idle")
        assert status is not None and status["starts"] == 2 and status["restarts"] == 0
    finally:
        service.close()
    status = read_status(env.root / "idle")
    assert status is not None and status["state"] == "stopped" and status["pid"] is None


def test_close_stops_the_child_and_its_jvm(service: SparkService) -> None:
    """Last in the module: closes the module's service. A call in flight is cut short."""
    service.ping()
    pid, jvm = service.pid, service.jvm_pid
    thread, errors = in_flight(service, SLOW_SQL)
    service.close()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], SparkServiceError) and "closed" in str(errors[0])
    assert service.state == "stopped" and service.pid is None
    assert not alive(pid) and not alive(jvm)  # close returns once both are gone
    with pytest.raises(SparkServiceError, match="closed"):
        service.ping()
    service.close()  # idempotent


def test_close_of_an_idle_service_stops_the_session_cleanly(env: Env) -> None:
    service = SparkService(env.config, start_timeout_s=240)
    service.ping()
    pid, jvm = service.pid, service.jvm_pid
    service.close()
    assert not alive(pid) and not alive(jvm)
    assert "Spark side process" not in service.state and service.state == "stopped"
