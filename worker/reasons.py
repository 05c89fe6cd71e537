"""What each bad-data reason means, in words: the dead-letter table's ``detail`` when a converter gave no detail of
its own for the row (pure; pool side).

Reasons are ``<reason>_<part>`` (``_key`` / ``_value``: the record part at fault) or a reason of the whole record
(``id_column_null``, ``corrupt_batch``, ...). The text names the cause and, where there is one, the setting or
the producer change that fixes it; it never holds payload bytes (the dead-letter row keeps those as they are).
"""

from __future__ import annotations

import re
from concurrent.futures import BrokenExecutor

ERROR_TEXT_MAX = 300
_PACKAGES = ("worker", "coordinator", "tabletopic", "configs")
_FRAMES = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_QUOTED = re.compile(r"b?'(?:[^'\\]|\\.)*'" + r'|b?"(?:[^"\\]|\\.)*"')

_SUFFIXES = ("_key", "_value")

_MEANING = {
    "null": "the {part} is null: there is no Confluent header (magic byte 0, 4-byte schema id) to read",
    "empty": "the {part} is empty: there is no Confluent header (magic byte 0, 4-byte schema id) to read",
    "wrong_magic_byte": "the {part} does not start with the Confluent magic byte 0: not written by a Confluent "
                        "serializer (for plain payloads use convert.{part}.type=by_latest_schema)",
    "truncated_header": "the {part} is shorter than the 5-byte Confluent header (magic byte 0, 4-byte schema id)",
    "bad_message_indexes": "the Protobuf message indexes after the {part}'s Confluent header do not decode or name "
                           "no message of the schema",
    "unknown_schema_id": "the schema registry has no schema with the id in the {part}'s Confluent header",
    "unsupported_schema": "the {part}'s schema cannot be a table column (see the broker log for the schema id and "
                          "why)",
    "type_mismatch": "a field of the {part} holds a value its table column's type cannot hold",
    "json_type_mismatch": "a field of the JSON {part} holds a value its table column's type cannot hold",
    "invalid_json": "the {part} is not UTF-8 JSON text",
    "not_a_json_object": "the JSON {part} is not an object, so it has no fields to put in columns",
    "json_unsupported_column": "a table column has a type JSON cannot fill (binary, decimal, fixed): the table was "
                               "changed outside the broker",
    "reserved_field": "the flattened {part} has a field named like a record column (_kafka_header, _kafka_key, "
                      "_kafka_metadata), which it cannot replace",
    "undecodable_avro": "the {part} does not decode with its Avro schema",
    "undecodable_protobuf": "the {part} does not decode as its Protobuf message",
    "trailing_bytes": "bytes are left over after the {part} decoded with its schema",
    "confluent_framed": "the {part} starts with a Confluent header (magic byte 0, schema id) on a by_latest_schema "
                        "topic, which reads plain payloads: use convert.{part}.type=by_schema_id",
    "invalid_utf8": "the {part} is not UTF-8 text",
    "debezium_bad_op": "the Debezium event's op is not c, r, u or d (a truncate or message event has no row)",
    "debezium_no_after": "the Debezium create/read/update event has no after row",
    "debezium_no_before": "the Debezium delete event has no before row",
}

_WHOLE_RECORD = {
    "id_column_null": "an id column (id.columns) is null in this record: an upsert/CDC row needs every id column",
    "id_column_missing": "the table has no column named by id.columns",
    "cdc_field_not_text": "the cdc.field value is not text (a struct, list, map or bytes that are not UTF-8)",
    "corrupt_batch": "the record batch does not decode",
}


def describe(reason: str) -> str:
    """The meaning of ``reason`` in words (the reason itself when it is not known here)."""
    if reason in _WHOLE_RECORD:
        return _WHOLE_RECORD[reason]
    for suffix in _SUFFIXES:
        base = reason.removesuffix(suffix)
        if base != reason and base in _MEANING:
            return _MEANING[base].format(part=suffix[1:])
    meaning = _MEANING.get(reason)
    return meaning.format(part="value") if meaning is not None else reason


def error_text(exc: BaseException) -> str:
    """``exc`` as one line for logs and the partition's state, without record contents (so no traceback, whose
    messages hold them too): quoted text (where Arrow and Python put the values they failed on, payload bytes
    included) becomes ``'…'``, then where it was raised (``at convert.py:245 in _fit``; a pool task's remote
    traceback is read for it); at most :data:`ERROR_TEXT_MAX` characters."""
    text = _QUOTED.sub("'…'", " ".join(str(exc).split()))
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(line) > ERROR_TEXT_MAX:
        line = line[: ERROR_TEXT_MAX - 1] + "…"
    where = _raised_at(exc)
    return f"{line} ({where})" if where else line


def _raised_at(exc: BaseException) -> str:
    """``at <file>:<line> in <function>`` of the innermost frame of this project's code (else the innermost one;
    a process pool's error: its remote traceback's)."""
    if exc.__cause__ is not None and _FRAMES.search(str(exc.__cause__)):
        frames = [(path, int(line), func) for path, line, func in _FRAMES.findall(str(exc.__cause__))]
    else:
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
    if not frames:
        return ""
    ours = [f for f in frames if any(f"/{pkg}/" in f[0] for pkg in _PACKAGES)]
    path, line, func = (ours or frames)[-1]
    where = path.replace("\\", "/")
    for pkg in _PACKAGES:  # the path from the package on (worker/convert.py), else the file name
        if f"/{pkg}/" in where:
            where = f"{pkg}/{where.rsplit(f'/{pkg}/', 1)[1]}"
            break
    else:
        where = where.rsplit("/", 1)[-1]
    return f"at {where}:{line} in {func}"


# the libraries through which storage, catalogs and registries answer: their errors are outages
_OUTAGE_MODULES = ("botocore", "aiobotocore", "s3fs", "fsspec", "requests", "urllib3", "aiohttp", "sqlalchemy",
                   "pyiceberg.exceptions", "google", "azure")


def is_outage(exc: BaseException) -> bool:
    """True for what a retry may cure (storage I/O, memory, a broken or timed-out conversion pool, the errors of
    storage, catalog and HTTP clients, an error whose ``retriable`` attribute is True: a Kafka client's, an attach
    direct read's); anything else a conversion raises fails the same way on the same records."""
    if isinstance(exc, (OSError, MemoryError, TimeoutError, BrokenExecutor)):
        return True
    if getattr(exc, "retriable", False) is True:  # says so itself: a Kafka client's error, a direct read's
        return True
    return any(type(exc).__module__ == m or type(exc).__module__.startswith(m + ".") for m in _OUTAGE_MODULES)
