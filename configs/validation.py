"""A topic's complete override set checked in one call: each setting, the rules between them, ``partition.by``.

The top of the configuration model: it imports the declarations (:mod:`configs.model`), the table topic rules
(:mod:`configs.table_topic`) and, only when a ``partition.by`` is set, the table's columns
(:mod:`configs.table_schema`, which brings pyiceberg: the admin CLIs import this package and must start fast).
"""

from __future__ import annotations

from collections.abc import Mapping

from configs.model import BrokerConfig, Value, check_kafka_topic_rules, parse_topic_configs, typed_or_none
from configs.table_topic import CDC_FIELD, ID_COLUMNS, PARTITION_BY, TableTopicConfig, check_table_topic_rules


def validate_topic_configs(configs: Mapping[str, str | None], broker: BrokerConfig | None = None) -> dict[str, Value]:
    """Validate a topic's complete override set; returns the parsed values. Raises InvalidConfigError.

    Checks each name (unknown: "Unknown topic config name: X"), type and range, then Kafka's rule between its
    settings and the rules between the table topic settings (:mod:`configs.table_topic`), then every
    ``partition.by``, ``id.columns`` and ``cdc.field`` column against the columns the converters produce. Rules
    that depend on broker settings (a schema registry URL for the schema converters) are checked only when
    ``broker`` is given.
    """
    parsed = parse_topic_configs(configs)
    check_kafka_topic_rules(parsed, broker)
    values = check_table_topic_rules(parsed, broker)
    cfg = TableTopicConfig.from_values(values)
    if cfg.partition_by:
        from configs.table_schema import check_partition_by

        check_partition_by(cfg, typed_or_none(values, PARTITION_BY, str))
    if cfg.id_columns:
        from configs.table_schema import check_id_columns

        check_id_columns(cfg, typed_or_none(values, ID_COLUMNS, str))
    if cfg.cdc_field:
        from configs.table_schema import check_cdc_field

        check_cdc_field(cfg, typed_or_none(values, CDC_FIELD, str))
    return parsed
