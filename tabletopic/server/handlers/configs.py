"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

Topics (resource type 2) are described, altered and validated through the configuration model
(:mod:`configs.admin`, :func:`configs.validation.validate_topic_configs`); changes are persisted through
``broker.topics.alter_configs``, which replaces a topic's overrides durably. The broker (resource type 4, name =
node id or empty) can be described; its settings are static (server.properties), so altering them is refused
with INVALID_REQUEST. Per-resource errors travel in the response with Kafka's codes and a message.

Checks that need more than the settings themselves (the table topic plugin host asks its Iceberg catalog whether a
converter change fits the table) are :class:`TopicConfigCheck` callables the broker holds in
``topic_config_checks``: this layer runs them (off the event loop: they block) without knowing who registered them.
CreateTopics runs them too (:func:`run_topic_config_checks`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

from configs.admin import ConfigEntry, apply_alter_ops, describe_broker, describe_topic
from configs.model import BrokerConfig
from configs.validation import validate_topic_configs
from tabletopic.errors import ConfigError, ErrorCode, InvalidConfigError, KafkaApiError, config_error
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

log = logging.getLogger(__name__)

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8


class TopicView(Protocol):
    """What these handlers read of a topic (``tabletopic.topics.TopicInfo``)."""

    @property
    def name(self) -> str: ...

    @property
    def configs(self) -> Mapping[str, str]: ...


class TopicStore(Protocol):
    """What these handlers call on ``broker.topics``."""

    def get(self, name: str) -> TopicView | None: ...

    async def alter_configs(self, name: str, new_overrides: dict[str, str]) -> None: ...


class TopicConfigCheck(Protocol):
    """A check of a topic's new overrides beyond the config model, e.g. against the topic's Iceberg table.

    ``old`` is None for a topic being created. May block (it is run in a worker thread). Raises
    InvalidConfigError (or another KafkaApiError) to refuse the change; any other exception refuses it as
    UNKNOWN_SERVER_ERROR.
    """

    def __call__(self, topic: str, old: Mapping[str, str] | None, new: Mapping[str, str]) -> None: ...


class ConfigsBroker(Protocol):
    """The part of ``tabletopic.broker.Broker`` these handlers use."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def topics(self) -> TopicStore: ...

    @property
    def topic_config_checks(self) -> Sequence[TopicConfigCheck]: ...


async def run_topic_config_checks(checks: Sequence[TopicConfigCheck], topic: str, old: Mapping[str, str] | None,
                                  new: Mapping[str, str]) -> None:
    """Run every registered check on a worker thread; raises KafkaApiError to refuse the change."""
    for check in list(checks):
        try:
            await asyncio.to_thread(check, topic, dict(old) if old is not None else None, dict(new))
        except KafkaApiError:
            raise
        except ConfigError as exc:
            raise config_error(exc) from exc
        except Exception as exc:
            log.exception("checking the new configs of topic %s failed", topic)
            raise KafkaApiError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                f"could not check the new configs of topic {topic}: {type(exc).__name__}: {exc}"
                                ) from exc


def _broker(ctx: RequestContext) -> ConfigsBroker:
    return cast(ConfigsBroker, ctx.broker)


def _topic(broker: ConfigsBroker, name: str) -> TopicView:
    topic = broker.topics.get(name)
    if topic is None:
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
    return topic


def _check_broker_name(broker: ConfigsBroker, name: str) -> None:
    if name not in ("", str(broker.config.node_id)):
        raise KafkaApiError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {broker.config.node_id} or empty string, but received {name}",
        )


def _unsupported(resource_type: int) -> KafkaApiError:
    return KafkaApiError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource_type}")


# ---- DescribeConfigs ----


def _describe(broker: ConfigsBroker, resource_type: int, name: str, keys: list[str] | None) -> list[ConfigEntry]:
    if resource_type == RESOURCE_TOPIC:
        return describe_topic(_topic(broker, name).configs, broker.config, keys)
    if resource_type == RESOURCE_BROKER:
        _check_broker_name(broker, name)
        return describe_broker(broker.config, keys)
    if resource_type == RESOURCE_BROKER_LOGGER:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Broker loggers are not supported")
    raise _unsupported(resource_type)


def _authorize(ctx: RequestContext, resource_type: int, name: str, operation: AclOperation) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the cluster for a broker's (and its loggers')
    settings, as Kafka's ConfigHelper and KafkaApis check them; raises Kafka's error for the resource."""
    if resource_type == RESOURCE_TOPIC:
        if not authz.allowed(ctx, operation, ResourceType.TOPIC, name):
            raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    elif resource_type in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER) and not authz.cluster_allowed(ctx, operation):
        raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


@handles(ApiKey.DescribeConfigs)
async def handle_describe_configs(ctx: RequestContext, req: Message) -> Message:
    broker = _broker(ctx)
    result_cls = ctx.response_class.DescribeConfigsResult
    entry_cls = result_cls.DescribeConfigsResourceResult
    synonym_cls = entry_cls.DescribeConfigsSynonym
    include_synonyms = bool(getattr(req, "include_synonyms", False))
    include_docs = bool(getattr(req, "include_documentation", False))
    results = []
    for res in req.resources:
        try:
            _authorize(ctx, res.resource_type, res.resource_name, AclOperation.DESCRIBE_CONFIGS)
            entries = _describe(broker, res.resource_type, res.resource_name, res.configuration_keys)
        except KafkaApiError as exc:
            results.append(result_cls(error_code=exc.code, error_message=exc.message, resource_type=res.resource_type,
                                      resource_name=res.resource_name, configs=[]))
            continue
        configs = [
            entry_cls(
                name=e.name,
                value=e.value,
                read_only=e.read_only,
                config_source=int(e.source),
                is_sensitive=e.sensitive,
                synonyms=[synonym_cls(name=s.name, value=s.value, source=int(s.source)) for s in e.synonyms]
                if include_synonyms else [],
                config_type=int(e.type),
                documentation=e.doc if include_docs else None,
            )
            for e in entries
        ]
        results.append(result_cls(error_code=0, error_message=None, resource_type=res.resource_type,
                                  resource_name=res.resource_name, configs=configs))
    return ctx.response(throttle_time_ms=0, results=results)


# ---- AlterConfigs / IncrementalAlterConfigs ----


def _new_overrides(broker: ConfigsBroker, topic: TopicView, configs: list[Message], incremental: bool
                   ) -> dict[str, str]:
    if incremental:
        ops = [(c.name, c.config_operation, c.value) for c in configs]
        return apply_alter_ops(topic.configs, ops, broker.config)
    # AlterConfigs replaces the whole override set
    new: dict[str, str] = {}
    for c in configs:
        if c.name in new:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys: {c.name}")
        if c.value is None:
            raise InvalidConfigError(f"Null value not supported for topic config {c.name}")
        new[c.name] = c.value
    return new


async def _alter_one(broker: ConfigsBroker, res: Message, incremental: bool, validate_only: bool) -> None:
    if res.resource_type == RESOURCE_BROKER:
        _check_broker_name(broker, res.resource_name)
        raise KafkaApiError(
            ErrorCode.INVALID_REQUEST,
            "Broker settings are static in tabletopic: change them in server.properties (or --override) "
            "and restart the broker",
        )
    if res.resource_type == RESOURCE_BROKER_LOGGER:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Broker loggers are not supported")
    if res.resource_type != RESOURCE_TOPIC:
        raise _unsupported(res.resource_type)
    topic = _topic(broker, res.resource_name)
    new = _new_overrides(broker, topic, res.configs, incremental)
    validate_topic_configs(new, broker.config)
    if new == dict(topic.configs):
        return
    await run_topic_config_checks(broker.topic_config_checks, res.resource_name, topic.configs, new)
    if validate_only:
        return
    await broker.topics.alter_configs(res.resource_name, new)
    log.info("[ALTER_CONFIGS] topic=%s overrides=%s", res.resource_name, new)


async def _alter(ctx: RequestContext, req: Message, incremental: bool) -> Message:
    broker = _broker(ctx)
    response_cls = ctx.response_class.AlterConfigsResourceResponse
    counts = Counter((r.resource_type, r.resource_name) for r in req.resources)
    responses = []
    for res in req.resources:
        code, message = ErrorCode.NONE, None
        try:
            if counts[(res.resource_type, res.resource_name)] > 1:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"Duplicate resource {res.resource_name}")
            _authorize(ctx, res.resource_type, res.resource_name, AclOperation.ALTER_CONFIGS)
            await _alter_one(broker, res, incremental, bool(req.validate_only))
        except KafkaApiError as exc:
            code, message = exc.code, exc.message
        except ConfigError as exc:
            code, message = config_error(exc).code, exc.message
        except Exception as exc:  # a storage failure must not take the connection down with it
            log.exception("altering the configs of %s failed", res.resource_name)
            code, message = ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
        responses.append(response_cls(error_code=int(code), error_message=message,
                                      resource_type=res.resource_type, resource_name=res.resource_name))
    return ctx.response(throttle_time_ms=0, responses=responses)


@handles(ApiKey.AlterConfigs)
async def handle_alter_configs(ctx: RequestContext, req: Message) -> Message:
    return await _alter(ctx, req, incremental=False)


@handles(ApiKey.IncrementalAlterConfigs)
async def handle_incremental_alter_configs(ctx: RequestContext, req: Message) -> Message:
    return await _alter(ctx, req, incremental=True)
