"""The broker: wires config, log, topics, groups and the network server, and runs their lifecycle.

Start order: log recovery (off the event loop) → topic table → group coordinator (committed offsets) →
schema registry (``_schemas`` replayed, HTTP listeners bound; when ``schema.registry.listeners`` is set) →
catalog and table topics → metrics → listeners. Stop order: the schema registry first, then stop accepting, let
in-flight requests finish (bounded), stop the table topics and metrics, stop the group coordinator, flush and
close every log, write the clean-shutdown marker.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING

from configs import InvalidConfigError, ListenerView
from configs.model import BrokerConfig
from configs.security import endpoint_listener, listener_views, quota_window, super_users
from tabletopic.catalog import open_broker_catalog
from tabletopic.datadir import DataDirLock
from tabletopic.groups import GroupConfig, GroupCoordinator
from tabletopic.log.manager import CleanerSettings, LogManager
from tabletopic.metrics import MetricsServer, TableTopicMetrics, start_metrics_server
from tabletopic.plugin_host import TableTopicHost
from tabletopic.producer_ids import ProducerIdManager
from tabletopic.security.acls import Authorizer
from tabletopic.security.credentials import ScramCredentialStore
from tabletopic.security.http_auth import BasicAuth
from tabletopic.security.jaas import parse_jaas, plain_users
from tabletopic.security.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QuotaManager, QuotaStore
from tabletopic.server import handlers
from tabletopic.server.handlers.configs import TopicConfigCheck
from tabletopic.server.network import KafkaServer
from tabletopic.topics import TopicManager
from tabletopic.transactions.coordinator import TransactionConfig, TransactionCoordinator
from tabletopic.transactions.markers import LogMarkerWriter
from tabletopic.transactions.store import TransactionStateStore

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

    from tabletopic.registry.server import RegistryServer

log = logging.getLogger(__name__)


def sasl_plain_users(listeners: list[ListenerView]) -> dict[str, dict[str, str]]:
    """The SASL/PLAIN users of each listener offering PLAIN, from its ``plain.sasl.jaas.config`` (Kafka's
    ``user_<name>="<password>"`` options); InvalidConfigError for a JAAS text Kafka would not read."""
    out: dict[str, dict[str, str]] = {}
    for view in listeners:
        for mechanism, text in view.jaas.items():
            if mechanism != "PLAIN":  # read for its syntax: a single broker has no inter-broker client to log in
                key = f"listener.name.{view.name.lower()}.{mechanism.lower()}.sasl.jaas.config"
                try:
                    parse_jaas(text)
                except ValueError as e:
                    raise InvalidConfigError(f"{key}: {e}", key=key) from e
                log.info("%s is read for its syntax only: a single broker has no inter-broker client that would "
                         "log in with it", key)
        if view.sasl and "PLAIN" in view.mechanisms:
            try:
                out[view.name] = plain_users(parse_jaas(view.jaas["PLAIN"]))
            except ValueError as e:
                key = f"listener.name.{view.name.lower()}.plain.sasl.jaas.config"
                raise InvalidConfigError(f"{key}: {e}", key=key) from e
    return out


class Broker:
    """A single-node Kafka-compatible broker. Handlers reach every subsystem through it."""

    def __init__(self, config: BrokerConfig, data_lock: DataDirLock | None = None) -> None:
        """``data_lock``: the lock on ``log.dirs`` if the caller took it already (else taken here); released by
        :meth:`stop`. Raises ``DataDirError`` when the directory is unusable or another broker holds it."""
        handlers.load_all()
        self.config = config
        self.node_id = config.node_id
        self.listeners = listener_views(config)  # raises InvalidConfigError for a listener Kafka would refuse
        adv = config.advertised_listeners[0]
        self.advertised_host = adv.host
        self.advertised_port = adv.port
        self._data_lock = data_lock or DataDirLock.acquire(config.log_dir)
        data_dir = config.log_dir.resolve()
        self.data_dir = data_dir
        self.logs = LogManager(
            data_dir,
            retention_check_interval_ms=config.log_retention_check_interval_ms,
            flusher_threads=config.log_flush_threads,
            cleaner=CleanerSettings(config.log_cleaner_enable, config.log_cleaner_backoff_ms,
                                    config.log_cleaner_dedupe_buffer_size,
                                    config.log_cleaner_io_max_bytes_per_second),
        )
        self.topics = TopicManager(config, self.logs)
        self.producer_ids = ProducerIdManager(data_dir / "__meta")
        self.scram_credentials = ScramCredentialStore(data_dir / "__meta" / "scram-credentials.json")
        self.plain_users = sasl_plain_users(self.listeners)  # listener name -> user -> password (their JAAS)
        # client quotas (AlterClientQuotas), applied to produce and fetch
        self.client_quotas = QuotaStore(data_dir / "__meta" / "client-quotas.json")
        samples, window = quota_window(config)
        self.produce_quota = QuotaManager(self.client_quotas, PRODUCER_BYTE_RATE, samples=samples, window_s=window)
        self.fetch_quota = QuotaManager(self.client_quotas, CONSUMER_BYTE_RATE, samples=samples, window_s=window)
        # Kafka's StandardAuthorizer when authorizer.class.name names it; None: every request allowed
        self.authorizer: Authorizer | None = None
        if config.values["authorizer.class.name"]:
            self.authorizer = Authorizer(data_dir / "__meta" / "acls.json",
                                         super_users=super_users(config.values["super.users"]),
                                         allow_everyone_if_no_acl_found=bool(
                                             config.values["allow.everyone.if.no.acl.found"]))
        self.groups = GroupCoordinator(
            GroupConfig(
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                max_size=config.group_max_size,
                offset_metadata_max_bytes=config.offset_metadata_max_bytes,
                offsets_retention_minutes=config.offsets_retention_minutes,
                consumer_protocol=config.consumer_group_protocol,
                consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
                consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
                consumer_assignors=config.consumer_group_assignors,
                consumer_max_size=config.group_consumer_max_size,
                consumer_migration_policy=str(config.values["group.consumer.migration.policy"]),
            ),
            data_dir,
            self.topics.partition_count,
            topic_names=lambda: (t.name for t in self.topics.all()),
        )
        self.transaction_store = TransactionStateStore(data_dir)
        self.transactions = TransactionCoordinator(
            self.transaction_store, self.producer_ids,
            LogMarkerWriter(self.logs.get, complete_offsets=self.groups.complete_transaction),
            TransactionConfig(max_timeout_ms=config.transaction_max_timeout_ms,
                              id_expiration_ms=config.transactional_id_expiration_ms,
                              abort_interval_ms=config.transaction_abort_interval_ms,
                              remove_expired_interval_ms=config.transaction_remove_expired_interval_ms),
        )
        self.server = KafkaServer(self)
        self.metrics = TableTopicMetrics()
        self.metrics_server: MetricsServer | None = None
        self.tables: TableTopicHost | None = None  # set at start when a catalog is configured
        self.registry: RegistryServer | None = None  # set at start when schema.registry.listeners is set
        # run by the config handlers on topic creation and config changes (the table topic host registers one)
        self.topic_config_checks: list[TopicConfigCheck] = []
        self.bound: list[tuple[str, int]] = []

    def endpoint(self, listener: str) -> tuple[str, int]:
        """The advertised (host, port) of listener ``listener`` (advertised.listeners by name, else listeners; port
        0: the port it was bound to), or the first listener's when it has none."""
        adv = endpoint_listener(self.config, listener)
        if adv is None:
            return self.advertised_host, self.advertised_port
        host, port = adv
        if port == 0:
            port = self.server.bound_by_listener.get(listener, (host, 0))[1]
        return host, port

    @property
    def cluster_id(self) -> str:
        return self.topics.cluster_id

    def _registry_security(self) -> tuple[list[ssl.SSLContext | None], Middleware | None]:
        """The registry's TLS contexts (https:// listeners: the broker's key store) and its guard (basic
        authentication when schema.registry.authentication.method=BASIC; ACLs on _schemas with an authorizer)."""
        from tabletopic.registry.security import broker_tls_context, registry_guard

        tls = [broker_tls_context(self.config, "schema.registry.listeners") if https else None
               for https in self.config.schema_registry_https]
        method, realm = self.config.schema_registry_auth
        auth = BasicAuth(self.scram_credentials, self.plain_users) if method == "BASIC" else None
        if auth is None and self.authorizer is None:
            return tls, None
        return tls, registry_guard(auth, realm, self.authorizer)

    async def start(self) -> None:
        t0 = time.monotonic()
        # first: its settings are refused before anything starts; basic authentication checks the broker's users
        self.metrics_server = start_metrics_server(self.config, self.metrics,
                                                   BasicAuth(self.scram_credentials, self.plain_users))
        await self.logs.start()
        self.topics.load()
        self.producer_ids.load()
        await self.groups.start()
        await asyncio.to_thread(self.transaction_store.open)
        await self.transactions.start()  # after the logs: transactions a crash left half-ended get their markers
        if self.config.schema_registry_listeners:
            from tabletopic.registry.server import RegistryServer  # aiohttp loads only when the registry is on

            self.registry = RegistryServer(self.topics, self.logs, self.config.schema_registry_listeners,
                                           *self._registry_security())
            await self.registry.start()
        # the broker is the one process that creates the catalog (readers only open it)
        catalog = await asyncio.to_thread(open_broker_catalog, self.config)
        if catalog is not None:
            self.tables = TableTopicHost(self, catalog, self.metrics)
            await self.tables.start()
        else:
            log.info("no catalog configured (automq.table.topic.catalog.type unset): table topics are off")
        # after the table topics: their partitions are cleaned only below what their tables hold
        self.logs.start_cleaner(self.tables.table_offset if self.tables is not None else None)
        # listeners last: a client that can connect finds every subsystem ready
        self.bound = await self.server.start()
        # a listener on port 0 gets its real port now; advertise what was actually bound
        if self.advertised_port == 0 and self.bound:
            self.advertised_port = self.endpoint(self.config.advertised_listeners[0].name)[1]
        log.info(
            "tabletopic node %d (cluster %s) listening on %s, advertising %s:%d; data in %s; started in %.0f ms",
            self.node_id, self.cluster_id, ", ".join(f"{h}:{p}" for h, p in self.bound),
            self.advertised_host, self.advertised_port, self.data_dir, (time.monotonic() - t0) * 1000,
        )

    async def stop(self) -> None:
        t0 = time.monotonic()
        if self.registry is not None:
            await self.registry.stop()
        log.info("shutting down: no new connections, finishing in-flight requests")
        self.server.stop_accepting()
        await self.server.drain(grace_s=min(10.0, self.config.shutdown_timeout_ms / 1000))
        log.info("connections closed after %.0f ms", (time.monotonic() - t0) * 1000)
        if self.tables is not None:
            await self.tables.stop()
            log.info("table topics stopped after %.0f ms", (time.monotonic() - t0) * 1000)
        if self.metrics_server is not None:
            self.metrics_server.stop()
        await self.transactions.stop()
        await self.transaction_store.close()
        await self.groups.close()
        await self.logs.close()
        self._data_lock.release()  # last: nothing below log.dirs is written after this
        log.info("shut down cleanly in %.0f ms", (time.monotonic() - t0) * 1000)
