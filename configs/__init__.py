"""The configuration model (declared settings, parsing, validation) and the shipped config files."""

from configs.model import (
    BROKER_SETTINGS,
    TOPIC_SETTINGS,
    BrokerConfig,
    Setting,
    Type,
    effective_topic_config,
    load_properties,
    parse_overrides,
    validate_topic_configs,
)
from configs.partition_spec import PartitionField, parse_id_columns, parse_partition_by
from configs.table_topic import (
    ConvertType,
    ErrorsTolerance,
    SchemaType,
    TableTopicConfig,
    TransformType,
    check_table_topic_rules,
)

__all__ = [
    "BROKER_SETTINGS",
    "TOPIC_SETTINGS",
    "BrokerConfig",
    "ConvertType",
    "ErrorsTolerance",
    "PartitionField",
    "SchemaType",
    "Setting",
    "TableTopicConfig",
    "TransformType",
    "Type",
    "check_table_topic_rules",
    "effective_topic_config",
    "load_properties",
    "parse_id_columns",
    "parse_overrides",
    "parse_partition_by",
    "validate_topic_configs",
]
