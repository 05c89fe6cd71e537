"""The driver JVM seen from Python: its errors, its health, Java classes and Iceberg-Java tables through py4j.

Shared by the operation modules of :mod:`tabletopic.spark` and by the side process's child loop
(:mod:`tabletopic.spark.service`), which tells a failed operation (:func:`describe_exception`) from a dead JVM
(:func:`jvm_connection_lost`) or a stopped SparkContext (:func:`context_stopped`).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) of a failed operation. For an exception thrown in the JVM the kind is its Java
    class (py4j's Py4JJavaError keeps it as ``java_exception``; pyspark's translations of the common ones, e.g.
    IllegalArgumentException or AnalysisException, as ``_origin``), else the Python class."""
    kind, text = type(exc).__name__, str(exc)
    java = getattr(exc, "java_exception", None)
    origin = java if java is not None else getattr(exc, "_origin", None)
    if origin is not None:
        with contextlib.suppress(Exception):  # the JVM is gone: keep the Python text
            kind = str(origin.getClass().getName())
            if java is not None:  # Py4JJavaError's own text is "An error occurred while calling ..." + a trace
                text = str(java.getMessage() or "")
    lines = text.strip().splitlines()
    return kind, lines[0] if lines else kind


def jvm_connection_lost(exc: BaseException) -> bool:
    """The py4j gateway to the driver JVM broke (the JVM died or hung up): the session is unusable. py4j raises
    its Py4JNetworkError mid-call, or the socket's ConnectionError when it opens a new connection."""
    return isinstance(exc, ConnectionError) or any(cls.__name__ == "Py4JNetworkError" for cls in type(exc).__mro__)


def context_stopped(session: SparkSession) -> bool:
    """The session's SparkContext was stopped under it: on a cluster, the master removed the application (killed
    from its UI, the master restarted, no master answered); every later statement fails. The JVM stays up."""
    return bool(session.sparkContext._jsc.sc().isStopped())


def jvm_process(session: SparkSession) -> subprocess.Popen[bytes] | None:
    """The session's driver JVM, which pyspark launched as a child of this process (None if it did not)."""
    proc: subprocess.Popen[bytes] | None = getattr(session.sparkContext._gateway, "proc", None)
    return proc


def jclass(session: SparkSession, name: str) -> Any:
    """The Java class ``name`` (fully qualified), for static calls and constructors. ``session._jvm.a.b.C`` first
    asks the JVM whether ``a``, ``a.b``, ... are classes, each a miss that searches every jar of the class path
    (about 1 ms per attribute here; a profile of an upsert stream's rounds found ~8% of the driver JVM's CPU in
    such misses): a class named in full is found at once."""
    from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

    gateway: Any = session.sparkContext._gateway
    return JavaClass(name, gateway._gateway_client)


def iceberg_table(session: SparkSession, catalog_name: str, identifier: Sequence[str]) -> Any:
    """The Iceberg-Java ``Table`` at ``identifier`` (namespace levels..., table name), loaded through the session's
    catalog plugin ``catalog_name``: no SQL identifier parsing, so any table name works unquoted."""
    return iceberg_catalog(session, catalog_name).loadTable(java_identifier(session, identifier))


def java_identifier(session: SparkSession, identifier: Sequence[str]) -> Any:
    """Iceberg-Java's TableIdentifier of ``(namespace levels..., table name)``."""
    if len(identifier) < 2:
        raise ValueError(f"table identifier {'.'.join(identifier)!r} has no namespace")
    gateway: Any = session.sparkContext._gateway
    levels = gateway.new_array(jclass(session, "java.lang.String"), len(identifier) - 1)
    for i, level in enumerate(identifier[:-1]):
        levels[i] = level
    namespace = jclass(session, "org.apache.iceberg.catalog.Namespace").of(levels)
    return jclass(session, "org.apache.iceberg.catalog.TableIdentifier").of(namespace, identifier[-1])


def iceberg_catalog(session: SparkSession, catalog_name: str) -> Any:
    """The Iceberg-Java catalog behind the session's catalog plugin ``catalog_name``."""
    return session._jsparkSession.sessionState().catalogManager().catalog(catalog_name).icebergCatalog()


def current_snapshot_id(table: Any) -> int | None:
    """The id of the Iceberg-Java table's current snapshot, None when it has none."""
    snapshot = table.currentSnapshot()
    return None if snapshot is None else int(snapshot.snapshotId())


class Steps:
    """Milliseconds per step of an operation, for its log line."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, step: str) -> None:
        """Record the time since the previous lap (or the start) under ``step``."""
        now = time.perf_counter()
        self.ms[step] = round((now - self._clock) * 1000, 1)
        self._clock = now


def iterate(iterable: Any, *, closeable: bool = False) -> Any:
    """The elements of a Java Iterable; a CloseableIterable (``closeable``) is closed at the end."""
    try:
        iterator = iterable.iterator()
        while iterator.hasNext():
            yield iterator.next()
    finally:
        if closeable:
            iterable.close()
