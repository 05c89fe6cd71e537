"""Parsing of ``automq.table.topic.partition.by`` and ``automq.table.topic.id.columns``: AutoMQ's list syntax
(:func:`split_list`) into :class:`PartitionField` items and column names.

Seam: :func:`parse_partition_by`, :func:`parse_id_columns`, :func:`resolve_column`. Errors are
:class:`InvalidConfigError` in Kafka's wording, naming the key, the value and the problem.

Rules: a dotted name is a column's Iceberg full name (the field names on its path joined with dots), so it needs no
quoting, and since Iceberg refuses two columns of one full name it denotes one column at most (names are
case-sensitive: ``Dup`` is not ``dup``). Pure: no catalog, no Iceberg import; :mod:`configs.table_schema` turns a
:class:`PartitionField` into an Iceberg spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from configs.errors import InvalidConfigError

PARTITION_BY_KEY = "automq.table.topic.partition.by"
ID_COLUMNS_KEY = "automq.table.topic.id.columns"

FROM_DEBEZIUM_KEY = "_from_debezium_key_"
"""The ``id.columns`` marker: take the identifier columns from the fields of the Debezium (schema-based) key."""

_COLUMN = re.compile(r"[a-zA-Z0-9_\-.]+")
_TRANSFORM = re.compile(r"(?s)([A-Za-z_]\w*)\s*\((.*)\)")

TIME_TRANSFORMS = ("year", "month", "day", "hour")
PARAM_TRANSFORMS = ("bucket", "truncate")
IDENTITY = "identity"


@dataclass(frozen=True, slots=True)
class PartitionField:
    """One partition field: ``transform`` applied to the (possibly nested) column ``source``.

    ``transform`` is ``identity``, ``year``, ``month``, ``day``, ``hour``, ``bucket`` or ``truncate``;
    ``param`` is N for ``bucket`` and W for ``truncate``, else None.
    """

    source: str
    transform: str = IDENTITY
    param: int | None = None

    @property
    def source_path(self) -> tuple[str, ...]:
        """The column's path: ``"a.b"`` → ``("a", "b")``."""
        return tuple(self.source.split("."))

    @property
    def name(self) -> str:
        """The partition field name, by Iceberg's conventions (``ts_month``, ``id_bucket``, ``s_trunc``)."""
        base = self.source.replace(".", "_")
        if self.transform == IDENTITY:
            return base
        if self.transform == "truncate":
            return f"{base}_trunc"
        return f"{base}_{self.transform}"

    def __str__(self) -> str:
        if self.transform == IDENTITY:
            return self.source
        if self.param is None:
            return f"{self.transform}({self.source})"
        return f"{self.transform}({self.source}, {self.param})"


_error = InvalidConfigError.invalid_value


def split_list(key: str, raw: str) -> list[str]:
    """Split AutoMQ's list syntax into stripped items: optional ``[...]``, commas outside parentheses.

    Blank input or ``[]`` gives an empty list; an empty item (``[a,,b]``) or unbalanced parentheses is an error.
    """
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    elif text.startswith("[") or text.endswith("]"):
        raise _error(key, raw, "unbalanced brackets")
    if not text:
        return []
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _error(key, raw, "unbalanced parentheses")
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise _error(key, raw, "unbalanced parentheses")
    items.append(text[start:].strip())
    if any(not item for item in items):
        raise _error(key, raw, "empty item in the list")
    return items


def check_column(key: str, raw: str, column: str) -> str:
    """Check one column name or dotted path (``[a-zA-Z0-9_\\-.]+``, no empty level); returns it."""
    if not _COLUMN.fullmatch(column):
        raise _error(key, raw, f"Invalid column name {column} (names match [a-zA-Z0-9_-.]+)")
    if any(not part for part in column.split(".")):
        raise _error(key, raw, f"Invalid column path {column}: empty path segment")
    return column


def resolve_column(name: str, fields: Callable[[tuple[str, ...]], Collection[str] | None]
                   ) -> tuple[str, ...] | None:
    """The field names on the path to the column whose full name is ``name`` (``a.b``: the top-level column ``a.b``
    when the table has one, else field ``b`` of struct ``a``), None when there is none. ``fields(path)``: the names
    of the fields of the struct at ``path`` (``()``: the top-level columns), None when the column there is not a
    struct.

    At each level the longest run of the remaining dotted parts that names a field is tried first (``a.b`` as a
    whole before ``a`` then ``b``), the shorter ones after it when the path cannot go on from there."""
    parts = name.split(".")

    def walk(path: tuple[str, ...], start: int) -> tuple[str, ...] | None:
        names = fields(path)
        if names is None:
            return None
        for end in range(len(parts), start, -1):
            field = ".".join(parts[start:end])
            if field in names:
                found = (*path, field) if end == len(parts) else walk((*path, field), end)
                if found is not None:
                    return found
        return None

    return walk((), 0)


def _positive_int(key: str, raw: str, transform: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise _error(key, raw, f"{transform}() needs a positive integer, got {text.strip()!r}") from None
    if value <= 0:
        raise _error(key, raw, f"{transform}() needs a positive integer, got {value}")
    return value


def parse_partition_field(key: str, raw: str, item: str) -> PartitionField:
    """Parse one item of ``partition.by``: ``year(c)``, ``month(c)``, ``day(c)``, ``hour(c)``, ``bucket(c, N)``,
    ``truncate(c, W)`` (transform names case-insensitive) or a bare column (identity)."""
    m = _TRANSFORM.fullmatch(item)
    if m is None:
        if "(" in item or ")" in item:
            raise _error(key, raw, f"malformed partition transform {item}")
        return PartitionField(check_column(key, raw, item))
    if "(" in m.group(2) or ")" in m.group(2):
        raise _error(key, raw, f"malformed partition transform {item}")
    transform = m.group(1).lower()
    args = [a.strip() for a in m.group(2).split(",")]
    if transform in TIME_TRANSFORMS:
        if len(args) != 1 or not args[0]:
            raise _error(key, raw, f"{transform}() takes one column, got {item}")
        return PartitionField(check_column(key, raw, args[0]), transform)
    if transform in PARAM_TRANSFORMS:
        what = "N" if transform == "bucket" else "W"
        if len(args) != 2 or not args[0]:
            raise _error(key, raw, f"{transform}() takes a column and {what}: {transform}(column, {what}), got {item}")
        return PartitionField(check_column(key, raw, args[0]), transform,
                              _positive_int(key, raw, transform, args[1]))
    raise _error(
        key, raw,
        f"unknown partition transform {m.group(1)} (expected year, month, day, hour, bucket, truncate or a column)",
    )


def parse_partition_by(raw: str | None, key: str = PARTITION_BY_KEY) -> tuple[PartitionField, ...]:
    """Parse a ``partition.by`` value; None or blank → no partitioning. Duplicate fields are refused."""
    if raw is None:
        return ()
    fields = tuple(parse_partition_field(key, raw, item) for item in split_list(key, raw))
    seen: set[str] = set()
    for f in fields:
        if f.name in seen:
            raise _error(key, raw, f"duplicate partition field {f}")
        seen.add(f.name)
    return fields


def parse_id_columns(raw: str | None, key: str = ID_COLUMNS_KEY) -> tuple[str, ...]:
    """Parse an ``id.columns`` value; None or blank → no identifier columns.

    ``[_from_debezium_key_]`` must stand alone; columns may be dotted paths and may not repeat.
    """
    if raw is None:
        return ()
    columns = split_list(key, raw)
    if FROM_DEBEZIUM_KEY in columns:
        if len(columns) != 1:
            raise _error(key, raw, f"{FROM_DEBEZIUM_KEY} must be used alone")
        return (FROM_DEBEZIUM_KEY,)
    for c in columns:
        check_column(key, raw, c)
    if len(set(columns)) != len(columns):
        raise _error(key, raw, "duplicate column")
    return tuple(columns)


def check_field_path(key: str, raw: str) -> str:
    """Check a single (dotted) field path such as ``cdc.field``; blank is allowed (= unset)."""
    if raw.strip():
        check_column(key, raw, raw.strip())
    return raw
