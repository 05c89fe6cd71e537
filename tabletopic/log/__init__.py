"""Partition log storage: segments, indexes, group fsync, idempotent-producer state, recovery."""

from tabletopic.log.flusher import Flusher
from tabletopic.log.log import AppendResult, LogConfig, PartitionLog, ReadResult, default_flusher
from tabletopic.log.manager import LogManager, parse_partition_dir
from tabletopic.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager

__all__ = [
    "AppendResult",
    "BatchMetadata",
    "Flusher",
    "LogConfig",
    "LogManager",
    "PartitionLog",
    "ProducerStateEntry",
    "ProducerStateManager",
    "ReadResult",
    "default_flusher",
    "parse_partition_dir",
]
