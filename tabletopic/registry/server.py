"""Start and stop the registry's HTTP listeners (``schema.registry.listeners``) on the broker's event loop."""

from __future__ import annotations

import logging
import ssl

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from configs.model import local_http_url
from tabletopic.log.manager import LogManager
from tabletopic.registry.api import make_app
from tabletopic.registry.service import RegistryService
from tabletopic.registry.store import SchemaStore
from tabletopic.topics import TopicManager

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5.0


class _ClientFaults(logging.Filter):
    """Malformed HTTP or a client gone mid-request is the client's fault, not the broker's: aiohttp answers it
    (400 / closes) and would log an ERROR with a traceback; here it is one DEBUG line at most."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError | ConnectionError):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = f"{record.getMessage()}: {exc!r}".replace("%", "%%"), ()
        record.exc_info, record.exc_text = None, None
        return http_log.isEnabledFor(logging.DEBUG)


http_log = logging.getLogger("tabletopic.registry.http")
http_log.addFilter(_ClientFaults())


class RegistryServer:
    """The registry served on ``listeners`` ((host, port) pairs): :meth:`start` replays ``_schemas`` and binds,
    :meth:`stop` closes the listeners after in-flight requests (bounded). ``tls``: per listener, the TLS context
    of an https:// one (None: plain HTTP); ``guard``: middleware run before every request (authentication)."""

    def __init__(self, topics: TopicManager, logs: LogManager, listeners: list[tuple[str, int]],
                 tls: list[ssl.SSLContext | None] | None = None, guard: Middleware | None = None) -> None:
        self.store = SchemaStore(topics, logs)
        self.service = RegistryService(self.store)
        self._listeners = listeners
        self._tls = tls or [None] * len(listeners)
        self._guard = guard
        self._runner: web.AppRunner | None = None
        self.bound: list[tuple[str, int]] = []

    async def start(self) -> list[tuple[str, int]]:
        """Replay the store, then bind every listener; returns the bound (host, port) pairs. Raises OSError when
        a listener cannot be bound (the broker does not start half-configured)."""
        await self.store.start()
        app = make_app(self.service)
        if self._guard is not None:
            app.middlewares.insert(0, self._guard)  # outermost: refuse before anything is parsed
        runner = web.AppRunner(app, access_log=None, logger=http_log,
                               shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        self._runner = runner
        try:
            for (host, port), tls in zip(self._listeners, self._tls, strict=True):
                await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=tls).start()
        except OSError:
            await self.stop()
            raise
        self.bound = [(str(a[0]), int(a[1])) for a in runner.addresses]
        log.info("schema registry listening on %s", ", ".join(f"{h}:{p}" for h, p in self.bound))
        return self.bound

    def local_url(self) -> str | None:
        """The URL a client on this host reaches the first bound listener at (https:// when it serves TLS)."""
        if not self.bound:
            return None
        url = local_http_url(*self.bound[0])
        return url.replace("http://", "https://", 1) if self._tls[0] is not None else url

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            log.info("schema registry stopped")
        self.service.close()
