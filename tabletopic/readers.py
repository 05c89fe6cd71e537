"""Independent readers of the committed tables: DuckDB (offline) and pyiceberg.

Used by tests and shown in the README as the quick way to look at a table without Spark. DuckDB reads a table
through its metadata file (``iceberg_scan``), so it needs no catalog access at all; a table in S3 (or an
S3-compatible store) is read with the S3 settings of its catalog (pyiceberg's ``s3.*`` FileIO properties, turned into
a DuckDB secret that is passed as query parameters, never as SQL text). :func:`duckdb_attach` reads through a REST
catalog instead. Extensions come from the ``duckdb-extension-*`` packages: nothing is ever downloaded.

Table names are read as Spark SQL reads them (:func:`table_identifier`): a topic name's dots are part of the table's
name, so ``default.`pg.public.customers``` or the tuple ``("default", "pg.public.customers")`` names it exactly;
:func:`load_table` also finds it from the unquoted ``default.pg.public.customers`` when no table of namespace
``default.pg.public`` is called ``customers``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

if TYPE_CHECKING:
    import duckdb
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

# avro first: the iceberg extension reads manifests through it; httpfs reads s3:// (and http) paths, aws adds the
# credential chain (environment, ~/.aws, instance roles) for S3 settings without keys
DUCKDB_EXTENSIONS = ("avro", "httpfs", "aws", "iceberg")
S3_SCHEMES = ("s3", "s3a", "s3n")


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


def duckdb_connect(properties: Mapping[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the bundled avro, httpfs, aws and iceberg extensions, never downloading one.

    With ``properties`` (a catalog's, or a table's ``io.properties``: pyiceberg's ``s3.*`` names) it also reads
    ``s3://`` paths of that object store (:func:`duckdb_s3_secret`, for every bucket).
    """
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in DUCKDB_EXTENSIONS:
        con.execute(f"LOAD '{_sql_quote(str(duckdb_extension_path(name)))}'")
    if properties is not None:
        duckdb_s3_secret(con, properties)
    return con


def s3_secret_options(properties: Mapping[str, str]) -> dict[str, str | bool]:
    """DuckDB S3 secret options from Iceberg's S3 FileIO properties (pyiceberg's names, ``client.*`` as fallbacks).

    ``s3.endpoint`` ``http(s)://host:port`` → ENDPOINT host:port and USE_SSL from the scheme; path-style URLs when
    ``s3.path-style-access`` is true, or it is unset and an endpoint is given (as pyiceberg's S3 client does), unless
    ``s3.force-virtual-addressing`` is true. No access key: DuckDB's credential chain (as pyiceberg's default).
    """
    def first(*keys: str) -> str | None:
        return next((properties[k] for k in keys if properties.get(k)), None)

    opts: dict[str, str | bool] = {}
    key_id = first("s3.access-key-id", "client.access-key-id")
    if key_id is not None:
        opts["KEY_ID"] = key_id
        opts["SECRET"] = first("s3.secret-access-key", "client.secret-access-key") or ""
        token = first("s3.session-token", "client.session-token")
        if token is not None:
            opts["SESSION_TOKEN"] = token
    region = first("s3.region", "client.region")
    if region is not None:
        opts["REGION"] = region
    endpoint = first("s3.endpoint")
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme in ("http", "https"):
            opts["ENDPOINT"] = parts.netloc + parts.path.rstrip("/")
            opts["USE_SSL"] = parts.scheme == "https"
        else:  # host:port, as DuckDB takes it
            opts["ENDPOINT"] = endpoint
    path_style = _flag(first("s3.path-style-access"))
    if _flag(first("s3.force-virtual-addressing")):
        path_style = False
    opts["URL_STYLE"] = "path" if (path_style if path_style is not None else endpoint is not None) else "vhost"
    return opts


def duckdb_s3_secret(con: duckdb.DuckDBPyConnection, properties: Mapping[str, str], location: str | None = None) -> str:
    """Create (or replace) a temporary DuckDB S3 secret from :func:`s3_secret_options`; returns its name.

    With ``location`` (an ``s3://bucket/...`` path) the secret is scoped to that bucket, so tables of several
    stores read side by side in one connection; without, it serves every bucket. The values go to DuckDB as query
    parameters: no key or secret is ever part of SQL text (nor of DuckDB's error messages about it).
    """
    opts = s3_secret_options(properties)
    params: dict[str, object] = {k.lower(): v for k, v in opts.items()}
    clauses = ["TYPE s3"] + [f"{k} ${k.lower()}" for k in opts]
    if "KEY_ID" not in opts:
        clauses.append("PROVIDER credential_chain")
    name = "tabletopic_s3"
    if location is not None:
        bucket = urlsplit(location).netloc
        params["scope"] = [f"{scheme}://{bucket}/" for scheme in S3_SCHEMES]
        clauses.append("SCOPE $scope")
        name += "_" + hashlib.sha1(bucket.encode(), usedforsecurity=False).hexdigest()[:12]
    con.execute(f"CREATE OR REPLACE SECRET {name} ({', '.join(clauses)})", params)
    return name


def duckdb_attach(con: duckdb.DuckDBPyConnection, catalog: Catalog | Mapping[str, str],
                  alias: str | None = None) -> str:
    """Attach a REST catalog to ``con`` with DuckDB's iceberg extension; returns the alias (default: the catalog's
    name, else ``tabletopic``). Its tables then read as ``<alias>."<namespace>"."<table>"`` (quote ``default``).

    ``catalog`` is a pyiceberg catalog or its properties (``uri``, ``warehouse``, ``credential=<id>:<secret>`` or
    ``token``, ``scope``, ``oauth2-server-uri``, the ``s3.*`` settings). The OAuth2 client credentials go into a
    temporary iceberg secret and the S3 settings into an S3 secret (:func:`duckdb_s3_secret`), both as parameters.
    ValueError for a catalog that is not a REST catalog.
    """
    if isinstance(catalog, Mapping):
        props, kind = dict(catalog), catalog.get("type", "rest")
    else:
        props, kind = {k: v for k, v in catalog.properties.items() if isinstance(v, str)}, type(catalog).__name__
        alias = alias or catalog.name
    if kind not in ("rest", "RestCatalog") or not props.get("uri"):
        raise ValueError(f"DuckDB attaches REST catalogs (with a uri) only, not {kind}: read its tables with "
                         "duckdb_scan")
    alias = alias or "tabletopic"
    uri = props["uri"].rstrip("/")
    if any(k.startswith(("s3.", "client.")) for k in props):
        duckdb_s3_secret(con, props)
    params = _iceberg_secret_params(props, uri)
    options = [f"ENDPOINT '{_sql_quote(uri)}'"]
    if params:
        secret = "tabletopic_iceberg_" + re.sub(r"\W", "_", alias)
        clauses = ", ".join(["TYPE iceberg", *(f"{k.upper()} ${k}" for k in params)])
        con.execute(f"CREATE OR REPLACE SECRET {secret} ({clauses})", params)
        options.append(f"SECRET {secret}")
    else:
        options.append("AUTHORIZATION_TYPE 'none'")
    quoted_alias = alias.replace('"', '""')
    con.execute(f"ATTACH OR REPLACE '{_sql_quote(props.get('warehouse', ''))}' AS \"{quoted_alias}\" "
                f"(TYPE iceberg, {', '.join(options)})")
    return alias


def _iceberg_secret_params(props: Mapping[str, str], uri: str) -> dict[str, str]:
    """DuckDB iceberg secret options from pyiceberg's REST auth properties: a bearer ``token``, or OAuth2 client
    credentials (``credential``, split at its first ':' as pyiceberg does) with pyiceberg's default scope and
    token endpoint (a bare secret is a client secret without an id). Empty when the catalog has no authentication."""
    if props.get("token"):  # pyiceberg uses a given token first too
        return {"token": props["token"]}
    credential = props.get("credential")
    if not credential:
        return {}
    client_id, client_secret = credential.split(":", 1) if ":" in credential else ("", credential)
    params = {"client_id": client_id, "client_secret": client_secret, "oauth2_scope": props.get("scope", "catalog"),
              "oauth2_server_uri": props.get("oauth2-server-uri", f"{uri}/v1/oauth/tokens")}
    return {k: v for k, v in params.items() if v}


def metadata_path(table: Table | str) -> str:
    """A table's current metadata file as a local path when it is one (DuckDB wants paths, not file:// URIs)."""
    location = table if isinstance(table, str) else table.metadata_location
    parts = urlsplit(location)
    return unquote(parts.path) if parts.scheme == "file" else location


def duckdb_scan(con: duckdb.DuckDBPyConnection, table: Table | str,
                properties: Mapping[str, str] | None = None) -> duckdb.DuckDBPyRelation:
    """A DuckDB relation over a table's current snapshot (a pyiceberg Table, or a metadata file location).

    A table in S3 is read with ``properties`` (pyiceberg's ``s3.*`` names), by default the Table's own
    ``io.properties`` (its catalog's settings and any credentials the catalog handed out), as a secret scoped to its
    bucket (:func:`duckdb_s3_secret`); a location string without ``properties`` uses the connection's secrets.
    Load the table again after a commit: a Table object (and its metadata file) is one version of the table.
    Chain relation methods for more, e.g. ``duckdb_scan(con, t).order("_kafka_metadata.offset").fetchall()``.
    """
    path = metadata_path(table)
    if properties is None and not isinstance(table, str):
        properties = {k: v for k, v in table.io.properties.items() if isinstance(v, str)}
    if properties is not None and urlsplit(path).scheme in S3_SCHEMES:
        duckdb_s3_secret(con, properties, location=path)
    return con.sql("SELECT * FROM iceberg_scan($path)", params={"path": path})


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


def _flag(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "true"
