"""The configuration model (declared settings, parsing, validation) and the shipped config files."""

from configs.errors import ConfigError, InvalidConfigError, InvalidRequestError
from configs.model import (
    BROKER_SETTINGS,
    TOPIC_SETTINGS,
    BrokerConfig,
    Setting,
    Type,
    Value,
    effective_topic_config,
    load_properties,
    parse_overrides,
)
from configs.partition_spec import PartitionField, parse_id_columns, parse_partition_by
from configs.security import ListenerView, listener_views
from configs.table_topic import (
    ConvertType,
    ErrorsTolerance,
    SchemaType,
    TableTopicConfig,
    TransformType,
    check_table_topic_rules,
)
from configs.validation import validate_topic_configs

__all__ = [
    "BROKER_SETTINGS",
    "TOPIC_SETTINGS",
    "BrokerConfig",
    "ConfigError",
    "ConvertType",
    "ErrorsTolerance",
    "InvalidConfigError",
    "InvalidRequestError",
    "ListenerView",
    "PartitionField",
    "SchemaType",
    "Setting",
    "TableTopicConfig",
    "TransformType",
    "Type",
    "Value",
    "check_table_topic_rules",
    "effective_topic_config",
    "listener_views",
    "load_properties",
    "parse_id_columns",
    "parse_overrides",
    "parse_partition_by",
    "validate_topic_configs",
]
