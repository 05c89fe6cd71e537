"""Independent readers of the committed tables: DuckDB (offline) and pyiceberg.

Used by tests and shown in the README as the quick way to look at a table without Spark. DuckDB reads a table
through its metadata file (``iceberg_scan``), so it needs no catalog access at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

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


def pyiceberg_rows(catalog: Catalog, identifier: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """Every row of the table's current snapshot, as dicts (maps come back as lists of (key, value) pairs)."""
    rows: list[dict[str, Any]] = catalog.load_table(identifier).scan().to_arrow().to_pylist()
    return rows


def _sql_quote(text: str) -> str:
    return text.replace("'", "''")
