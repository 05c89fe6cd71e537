"""The broker's Iceberg catalog: the one place that turns ``automq.table.topic.catalog.*`` into a pyiceberg catalog.

``sql`` (the embedded catalog) is pyiceberg's ``SqlCatalog`` (parsing each metadata file once:
``tabletopic.caching_catalog``), whose tables are Iceberg-Java's ``JdbcCatalog``
schema V1, so Spark (``tabletopic.spark``) opens the very same catalog under the same name. For SQLite this
module owns the settings that make sharing the file safe: a busy timeout, WAL journal mode, and creating the
catalog tables here (Iceberg-Java must not: see ``tabletopic.spark``). Every other type goes to pyiceberg's
``load_catalog`` unchanged.

Only the broker creates the catalog (``load_catalog(config, create=True)``); every reader (``tabletopic sql``,
``tables``, Spark sessions, user code) opens an existing one, so that wrong settings say "no catalog at ..."
instead of creating an empty catalog somewhere else. ``broker_config`` reads the broker's settings the way
``tabletopic serve`` does, for readers to find the same catalog.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import configs
from configs.model import BrokerConfig, load_properties, parse_overrides
from tabletopic.errors import InvalidConfigError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

URI_KEY = "automq.table.topic.catalog.uri"
WAREHOUSE_KEY = "automq.table.topic.catalog.warehouse"
# SQLite waits this long for a lock held by another process (pyiceberg's committer, Spark) before SQLITE_BUSY.
SQLITE_BUSY_TIMEOUT_S = 30
# the properties file `tabletopic serve` reads when given none
DEFAULT_CONFIG = Path(configs.__file__).resolve().parent / "server.properties"
# a table of Iceberg-Java's JdbcCatalog schema (pyiceberg's SqlCatalog): present once the broker created the catalog
_CATALOG_TABLE = "iceberg_tables"


class CatalogUnavailableError(RuntimeError):
    """The configured catalog cannot be opened from this process (e.g. a missing database driver)."""


class CatalogNotFoundError(CatalogUnavailableError):
    """The configured catalog does not exist: only the broker creates it, readers open an existing one."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"no catalog at {where}: the broker creates it when it starts; give the settings the broker runs with "
            "(the same --config file and --override log.dirs=... options)"
        )
        self.where = where


def broker_config(config_path: str | Path | None = None,
                  overrides: Mapping[str, str] | Iterable[str] = ()) -> BrokerConfig:
    """The broker's settings as ``tabletopic serve`` reads them: the properties file (default: the shipped
    ``configs/server.properties``), then ``overrides`` (a mapping, or ``key=value`` strings as ``--override``).

    Raises FileNotFoundError for a ``config_path`` that does not exist and InvalidConfigError for a bad setting.
    """
    path = Path(config_path) if config_path is not None else DEFAULT_CONFIG
    props: dict[str, str] = {}
    if path.exists():
        props = load_properties(path)
    elif config_path is not None:
        raise FileNotFoundError(f"config file {path} not found")
    props.update(dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides))
    return BrokerConfig.from_properties(props)


def default_sql_properties(config: BrokerConfig) -> dict[str, str]:
    """The embedded catalog's location when ``uri``/``warehouse`` are not set: under ``log.dirs``, like the
    shipped server.properties."""
    root = config.log_dir.resolve() / "iceberg"
    return {"uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": (root / "warehouse").as_uri()}


def sql_catalog_properties(config: BrokerConfig) -> dict[str, str]:
    """The ``sql`` catalog's pyiceberg properties, normalised: defaults filled in, SQLite busy timeout added."""
    from tabletopic.fileio import FILE_IO_IMPL  # imported here: it loads pyarrow, which the CLIs' --help need not

    # local files written for the catalog (metadata, manifests, data) are fsynced before they are referenced
    props = {**default_sql_properties(config), "py-io-impl": FILE_IO_IMPL, **config.catalog_properties}
    props.pop("type", None)
    props["uri"] = with_sqlite_timeout(props["uri"])
    return props


def is_sqlite(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLAlchemy ``sqlite:///`` URI (absolute), None for an in-memory database."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().resolve()


def with_sqlite_timeout(uri: str) -> str:
    """Add ``timeout=30`` (seconds, sqlite3's busy timeout) to a SQLite URI that has none; others unchanged."""
    if not is_sqlite(uri):
        return uri
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    if "timeout" in url.query:
        return uri
    return url.update_query_dict({"timeout": str(SQLITE_BUSY_TIMEOUT_S)}).render_as_string(hide_password=False)


def local_warehouse_path(warehouse: str) -> Path | None:
    """The directory of a ``file://`` (or scheme-less) warehouse, None for object stores."""
    parts = urlsplit(warehouse)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme == "":
        return Path(warehouse).expanduser().resolve()
    return None


def enable_wal(db_path: Path) -> None:
    """Put the SQLite database in WAL mode (persistent in the file, so a no-op once done).

    WAL lets Spark's reads proceed while pyiceberg commits; in rollback mode a reader blocks the writer.
    """
    con = sqlite3.connect(db_path, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        mode = con.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            log.info("catalog database %s: journal_mode=%s", db_path, mode)
    finally:
        con.close()


def _check_driver(uri: str) -> None:
    if uri.startswith("postgresql"):
        try:
            import psycopg2  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
        except ImportError:
            raise CatalogUnavailableError(
                f"{URI_KEY}={_redact(uri)} needs the psycopg2 driver: pip install psycopg2-binary into .venv"
            ) from None


def _prepare_sql(props: Mapping[str, str]) -> None:
    """The broker's side: create the SQLite file's directory (WAL on) and a local warehouse directory."""
    uri = props["uri"]
    if is_sqlite(uri):
        db = sqlite_path(uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            enable_wal(db)
    _check_driver(uri)
    warehouse = props.get("warehouse")
    if warehouse:
        path = local_warehouse_path(warehouse)
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)


def _require_sql_catalog(uri: str) -> None:
    """A reader's side: the catalog's tables exist, checked without creating anything (no SQLite file, no table).

    Raises CatalogNotFoundError naming the file (or the redacted URI) otherwise.
    """
    where = _redact(uri)
    if is_sqlite(uri):
        db = sqlite_path(uri)
        if db is None:  # in-memory, or a file: URI that connecting would create
            raise CatalogUnavailableError(f"{URI_KEY}={where} is not a database file that a reader can open")
        if not db.is_file():  # connecting would create an empty database file
            raise CatalogNotFoundError(str(db))
        where = str(db)
    _check_driver(uri)
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(uri)
    try:
        exists = inspect(engine).has_table(_CATALOG_TABLE)
    except SQLAlchemyError as exc:
        raise CatalogUnavailableError(f"cannot open the catalog at {where}: {exc}") from None
    finally:
        engine.dispose()
    if not exists:
        raise CatalogNotFoundError(where)


def require_catalog(config: BrokerConfig) -> None:
    """Check that the broker's catalog exists, creating nothing (readers call this before opening it).

    Only ``sql`` catalogs are checked here: for the others (REST, Glue, ...) the catalog is a service that
    readers connect to and never create.
    """
    if config.catalog_type == "sql":
        _require_sql_catalog(_sql_uri(sql_catalog_properties(config)))


def _sql_uri(props: Mapping[str, str]) -> str:
    uri = props.get("uri")
    if not uri:
        raise InvalidConfigError(f"Invalid value for configuration {URI_KEY}: a sql catalog needs a uri")
    return uri


def load_catalog(config: BrokerConfig, *, create: bool = False) -> Catalog | None:
    """Open the broker's catalog, named ``config.catalog_name``; None when ``catalog.type`` is unset.

    ``sql``: a pyiceberg ``SqlCatalog`` (:class:`~tabletopic.caching_catalog.CachingSqlCatalog`; SQLite or
    PostgreSQL URI); any other type: ``pyiceberg.catalog.load_catalog(name, **properties)``. Only the broker
    passes ``create=True`` (make the SQLite file, the warehouse directory and the catalog tables when missing); a
    reader gets CatalogNotFoundError when the catalog does not exist yet.
    """
    catalog_type = config.catalog_type
    if catalog_type is None:
        return None
    name = config.catalog_name
    if catalog_type == "sql":
        from tabletopic.caching_catalog import CachingSqlCatalog

        props = sql_catalog_properties(config)
        uri = _sql_uri(props)
        if create:
            _prepare_sql(props)
        else:
            _require_sql_catalog(uri)
            # pyiceberg creates missing catalog tables unless told not to (a broker dropping them meanwhile)
            props["init_catalog_tables"] = "false"
        catalog = CachingSqlCatalog(name, **props)
        log.info("catalog %s: sql at %s, warehouse %s", name, _redact(uri), props.get("warehouse"))
        return catalog

    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    props = config.catalog_properties
    log.info("catalog %s: %s at %s", name, catalog_type, _redact(props.get("uri", "")))
    opened = pyiceberg_load_catalog(name, **props)
    _bound_requests(opened, config.catalog_request_timeout_ms / 1000)
    return opened


def _bound_requests(catalog: Catalog, timeout_s: float) -> None:
    """Give a REST catalog's HTTP requests a time-out (``table.topic.catalog.request.timeout.ms``).

    pyiceberg's RestCatalog sets none, so a catalog that accepts a connection and never answers would hold a
    round's commit for ever; timed out, the commit's outcome is settled by reading the table back. The session is
    pyiceberg's private ``_session``: catalogs without one are left as they are."""
    from requests import Session
    from requests.adapters import HTTPAdapter

    session = getattr(catalog, "_session", None)
    if not isinstance(session, Session):
        return

    class TimeoutAdapter(HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = timeout_s
            return super().send(request, *args, **kwargs)

    for scheme in ("http://", "https://"):
        session.mount(scheme, TimeoutAdapter())


class DeferredCatalog:
    """A catalog opened at its first use that succeeds: until then every use raises the error of the last
    attempt (an outage, which the callers retry: rounds with back-off, topic creation with its error).

    A REST catalog (or a PostgreSQL server) that cannot be reached when the broker starts must not keep the broker
    from serving Kafka clients; its table topics wait for it instead. Attribute access is delegated to the opened
    catalog, so it stands wherever a pyiceberg ``Catalog`` is used (tables it loads name the real catalog)."""

    def __init__(self, name: str, open_catalog: Callable[[], Catalog]) -> None:
        self.name = name
        self._open = open_catalog
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()

    def opened(self) -> Catalog:
        """The catalog, opened now if it was not yet; raises what opening raises."""
        with self._lock:
            if self._catalog is None:
                self._catalog = self._open()
                log.warning("catalog %s: reachable now, table topics go on", self.name)
            return self._catalog

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.opened(), attr)


def is_unreachable(exc: BaseException) -> bool:
    """Whether opening a catalog failed for an outage (a refused or broken connection, a timeout, a database that
    is down), not for its settings. requests' errors are OSErrors."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - sqlalchemy comes with pyiceberg[sql-*]
        return False
    return isinstance(exc, OperationalError)


def open_broker_catalog(config: BrokerConfig) -> Catalog | None:
    """The broker's catalog (``load_catalog(config, create=True)``), or, when it cannot be reached now, a
    :class:`DeferredCatalog` that opens it once it can; None when ``catalog.type`` is unset. Wrong settings
    still raise."""
    try:
        return load_catalog(config, create=True)
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        log.warning("catalog %s cannot be reached (%s: %s): the broker serves Kafka clients meanwhile and table "
                    "topics wait for the catalog", config.catalog_name, type(exc).__name__, exc)

        def reopen() -> Catalog:
            catalog = load_catalog(config, create=True)
            assert catalog is not None  # the type is set: load_catalog returned or raised before
            return catalog

        return cast("Catalog", DeferredCatalog(config.catalog_name, reopen))


def _redact(uri: str) -> str:
    """A URI without its password, for logs."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
