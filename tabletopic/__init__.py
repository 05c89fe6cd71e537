"""tabletopic: a Kafka-compatible broker whose topics materialize, exactly once, as Apache Iceberg tables."""

__version__ = "0.1.0"
