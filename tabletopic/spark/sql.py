"""Spark SQL statements run by the side process: rows as plain Python values, for a process without pyspark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def plain(value: Any) -> Any:
    """A collected value with pyspark's Row (a tuple subclass) turned into a plain tuple, recursively: picklable
    by a process that has no pyspark."""
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def sql_rows(session: SparkSession, statement: str, max_rows: int) -> list[tuple[Any, ...]]:
    """Run one statement and return its rows as plain tuples; ValueError when it returns more than ``max_rows``."""
    rows = session.sql(statement).take(max_rows + 1)
    if len(rows) > max_rows:
        raise ValueError(f"the statement returned more than {max_rows} rows")
    return [plain(row) for row in rows]
