"""Independent readers of the committed tables: DuckDB (offline) and pyiceberg.

Used by tests and shown in the README as the quick way to look at a table without Spark. DuckDB reads a table
through its metadata file (``iceberg_scan``), so it needs no catalog access at all.

Table names are read as Spark SQL reads them (:func:`table_identifier`): a topic name's dots are part of the table's
name, so ``default.`pg.public.customers``` or the tuple ``("default", "pg.public.customers")`` names it exactly;
:func:`load_table` also finds it from the unquoted ``default.pg.public.customers`` when no table of namespace
``default.pg.public`` is called ``customers``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

if TYPE_CHECKING:
    import duckdb
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

# avro first: the iceberg extension reads manifests through it
DUCKDB_EXTENSIONS = ("avro", "iceberg")


def duckdb_extension_path(name: str) -> Path:
    """The ``.duckdb_extension`` file bundled by the ``duckdb-extension-<name>`` package for this DuckDB."""
    import importlib

    import duckdb

    package = importlib.import_module(f"duckdb_extension_{name}")
    base = Path(str(package.__file__)).parent / "extensions"
    exact = base / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if exact.exists():
        return exact
    raise FileNotFoundError(f"{exact} is missing: install duckdb-extension-{name}=={duckdb.__version__}")


def duckdb_connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the bundled avro and iceberg extensions, never reaching for the network."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in DUCKDB_EXTENSIONS:
        con.execute(f"LOAD '{_sql_quote(str(duckdb_extension_path(name)))}'")
    return con


def metadata_path(table: Table | str) -> str:
    """A table's current metadata file as a local path when it is one (DuckDB wants paths, not file:// URIs)."""
    location = table if isinstance(table, str) else table.metadata_location
    parts = urlsplit(location)
    return unquote(parts.path) if parts.scheme == "file" else location


def duckdb_scan(con: duckdb.DuckDBPyConnection, table: Table | str) -> duckdb.DuckDBPyRelation:
    """A DuckDB relation over a table's current snapshot (a pyiceberg Table, or a metadata file location).

    Load the table again after a commit: a Table object (and its metadata file) is one version of the table.
    Chain relation methods for more, e.g. ``duckdb_scan(con, t).order("_kafka_metadata.offset").fetchall()``.
    """
    return con.sql("SELECT * FROM iceberg_scan($path)", params={"path": metadata_path(table)})


def table_identifier(name: str | tuple[str, ...]) -> tuple[str, ...]:
    """A table name as Spark SQL reads it: parts separated by dots, a part in back-quotes taken whole (dots and
    all; a doubled back-quote inside is one), e.g. ``default.`pg.public.customers``` → ``("default",
    "pg.public.customers")``. A tuple is returned as it is. ValueError for an empty part or an open quote."""
    if isinstance(name, tuple):
        return name
    parts: list[str] = []
    pos = 0
    while True:
        m = _PART.match(name, pos)
        if m is None:
            raise ValueError(f"not a table name: {name!r} (an empty part or an unclosed back-quote)")
        quoted = m.group("quoted")
        parts.append(quoted.replace("``", "`") if quoted is not None else m.group("plain"))
        pos = m.end()
        if pos == len(name):
            return tuple(parts)
        pos += 1  # the dot


_PART = re.compile(r"`(?P<quoted>(?:[^`]|``)+)`(?=\.|$)|(?P<plain>[^.`]+)(?=\.|$)")


def load_table(catalog: Catalog, name: str | tuple[str, ...]) -> Table:
    """The table ``name`` names (see :func:`table_identifier`).

    An unquoted name with more dots than a namespace has is tried as Spark reads it first (the last part is the
    table), then with the dots of its last parts inside the table's name (``default.pg.public.customers`` finds
    the table topic ``pg.public.customers`` of namespace ``default``). NoSuchTableError when none exists.
    """
    parts = table_identifier(name)
    if isinstance(name, tuple) or "`" in name:
        return catalog.load_table(parts)
    for cut in range(len(parts) - 1, 0, -1):
        try:
            return catalog.load_table((*parts[:cut], ".".join(parts[cut:])))
        except (NoSuchTableError, NoSuchNamespaceError):
            continue
    raise NoSuchTableError(f"Table does not exist: {name}")


def pyiceberg_rows(catalog: Catalog, identifier: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """Every row of the table's current snapshot, as dicts (maps come back as lists of (key, value) pairs);
    ``identifier`` as :func:`load_table` takes it."""
    rows: list[dict[str, Any]] = load_table(catalog, identifier).scan().to_arrow().to_pylist()
    return rows


def _sql_quote(text: str) -> str:
    return text.replace("'", "''")
