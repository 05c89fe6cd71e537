"""Attach mode: table topics for the topics of an existing Kafka-compatible cluster (``tabletopic attach``).

Instances join one consumer group of that cluster; each runs the :class:`~tabletopic.table_runtime.TableTopicRuntime`
parts for the partitions it is assigned (the owner of a topic's partition 0 runs its coordinator), reading the
partitions' raw record batches itself and talking to the other instances over a control topic. Settings of attached
topics live in a compacted settings topic on the cluster. See docs/attach.md.
"""
