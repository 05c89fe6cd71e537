"""The log cleaner: ``cleanup.policy=compact`` applied as Kafka's cleaner applies it.

Modules: :mod:`.service` (the loop side: which log to clean, when, the process it runs in, the swap),
:mod:`.job` (one pass over a log's files, in that process), :mod:`.records` (a batch's records and its rewrite),
:mod:`.swap` (the crash-safe replacement of segments and the cleaner's checkpoint, also used when a log opens).
Behaviour and guarantees: docs/guarantees.md, "Compacted topics".
"""
