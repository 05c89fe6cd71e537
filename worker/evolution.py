"""Record types against table types: what a table must gain to hold a record type, and Arrow values conformed to
the table's columns (pure; pool side).

Seam: :func:`needed_change` (the rules are listed there) compares the Iceberg type a record was written with
(from its registry schema, or inferred from JSON) with the table column it goes to, and returns what the table
must take in as an Iceberg schema (JSON) of the top level, which the coordinator has the Spark side process apply
(``unionByNameWith``) before the next round; :func:`conform` / :func:`conform_rows` cast values to the table's
column type by name.

Rules: evolution works by name, as Iceberg's ``union_by_name`` does; columns are only added, widened or made
optional, never dropped or renamed; values are cast only where nothing is lost, and a value that cannot be makes
its row bad (``errors.tolerance``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
)


def widens(narrow: IcebergType, wide: IcebergType) -> bool:
    """True when Iceberg can promote a ``narrow`` column to ``wide`` (int → long, float → double, decimal
    precision up at the same scale)."""
    if isinstance(narrow, IntegerType) and isinstance(wide, LongType):
        return True
    if isinstance(narrow, FloatType) and isinstance(wide, DoubleType):
        return True
    return (isinstance(narrow, DecimalType) and isinstance(wide, DecimalType) and narrow.scale == wide.scale
            and wide.precision > narrow.precision)


class _Ids:
    """Fresh field ids for the change schema (the catalog assigns the real ones; these only have to be unique)."""

    def __init__(self) -> None:
        self.next = 1

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


def _change(table: IcebergType, record: IcebergType, ids: _Ids) -> IcebergType | None:
    """What ``table`` must become to hold ``record`` (only the parts that change), None when nothing."""
    if isinstance(table, StructType) and isinstance(record, StructType):
        return _struct_change(table, record, ids)
    if isinstance(table, ListType) and isinstance(record, ListType):
        element = _change(table.element_type, record.element_type, ids)
        optional = table.element_required and not record.element_required
        if element is None and not optional:
            return None
        return ListType(ids(), element if element is not None else _copy(table.element_type, ids),
                        element_required=False if optional else table.element_required)
    if isinstance(table, MapType) and isinstance(record, MapType):
        value = _change(table.value_type, record.value_type, ids)
        optional = table.value_required and not record.value_required
        if value is None and not optional:
            return None
        return MapType(ids(), _copy(table.key_type, ids), ids(),
                       value if value is not None else _copy(table.value_type, ids),
                       value_required=False if optional else table.value_required)
    if isinstance(table, PrimitiveType) and isinstance(record, PrimitiveType) and widens(table, record):
        return record
    return None  # the same type, a narrower one, or one never applied (conform casts or rejects the values)


def _struct_change(table: StructType, record: StructType, ids: _Ids) -> StructType | None:
    have = {f.name: f for f in table.fields}
    fields: list[NestedField] = []
    changed = False
    for rf in record.fields:
        tf = have.get(rf.name)
        if tf is None:
            fields.append(NestedField(ids(), rf.name, _copy(rf.field_type, ids), required=False, doc=rf.doc))
            changed = True
            continue
        sub = _change(tf.field_type, rf.field_type, ids)
        optional = tf.required and not rf.required
        if sub is not None or optional:
            changed = True
            fields.append(NestedField(ids(), tf.name, sub if sub is not None else _copy(tf.field_type, ids),
                                      required=False if optional else tf.required))
    for tf in table.fields:  # a required field the record lacks becomes optional
        if tf.required and tf.name not in {rf.name for rf in record.fields}:
            fields.append(NestedField(ids(), tf.name, _copy(tf.field_type, ids), required=False))
            changed = True
    return StructType(*fields) if changed else None


def _copy(typ: IcebergType, ids: _Ids) -> IcebergType:
    """``typ`` with fresh ids (and every field optional: columns added to a table always are)."""
    if isinstance(typ, StructType):
        return StructType(*(NestedField(ids(), f.name, _copy(f.field_type, ids), required=False, doc=f.doc)
                            for f in typ.fields))
    if isinstance(typ, ListType):
        return ListType(ids(), _copy(typ.element_type, ids), element_required=False)
    if isinstance(typ, MapType):
        return MapType(ids(), _copy(typ.key_type, ids), ids(), _copy(typ.value_type, ids), value_required=False)
    return typ


def needed_change(table_schema: Schema, column: str | None, record: IcebergType) -> str | None:
    """The change ``table_schema`` needs so that ``column`` (None: the top level, for flattened values) holds
    ``record`` values, as Iceberg schema JSON of the table's top level holding only what the record needs; None
    when it holds them.

    - a field the table lacks (also inside structs, list elements and map values) → added, optional;
    - int → long, float → double, decimal(p, s) → decimal(p', s) with p' > p → the column is widened;
    - a required table field that the record makes optional, or lacks → made optional;
    - a narrower record type (an int into a long column) → nothing: the values are cast;
    - anything else (a string where the table has an int, a struct where it has a list) is never applied, the
      table keeps its type: :func:`conform` casts the values when Arrow can do it losslessly (``safe`` casts), and
      a value it cannot cast makes its row bad.
    """
    ids = _Ids()
    top = table_schema.as_struct()
    if column is None:
        if not isinstance(record, StructType):
            return None  # only a struct can be flattened; conform rejects the rows
        change = _struct_change(top, record, ids)
        return None if change is None else Schema(*change.fields).model_dump_json()
    wrapped = StructType(NestedField(0, column, record, required=False))
    existing = next((f for f in top.fields if f.name == column), None)
    current = StructType() if existing is None else StructType(existing)
    change = _struct_change(current, wrapped, ids)
    return None if change is None else Schema(*change.fields).model_dump_json()


# ------------------------------------------------------------------------------------------------ values


class ConformError(ValueError):
    """Values that cannot be cast to the table's column type; ``path``: the struct fields down to the values that
    failed (empty: the values themselves), ``why``: the cause."""

    def __init__(self, why: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(f"field {'.'.join(path)}: {why}" if path else why)
        self.why, self.path = why, path


def _flat_children(arr: pa.StructArray) -> dict[str, pa.Array]:
    typ = arr.type
    return {typ.field(i).name: child for i, child in enumerate(arr.flatten())}


def _validity(arr: pa.Array) -> pa.Array | None:
    return pc.is_null(arr) if arr.null_count else None


def _offsets(arr: pa.Array) -> pa.Array:
    """The offsets of a list or map array, as a fresh array (``from_arrays`` refuses a sliced offsets array
    together with a null mask)."""
    offsets = arr.offsets
    return offsets if offsets.offset == 0 else pc.add(offsets, pa.scalar(0, offsets.type))


def conform(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """``arr`` as values of ``target`` (the table column's Arrow type), matching struct fields by name: fields the
    values lack become nulls, fields the table lacks are dropped, primitives are cast safely. Raises
    :class:`ConformError` when a value cannot be cast (use :func:`conform_rows` to find which)."""
    if arr.type == target:
        return arr
    try:
        if pa.types.is_struct(target):
            if not pa.types.is_struct(arr.type):
                raise ConformError(f"a {arr.type} cannot become {target}")
            have = _flat_children(arr)
            children = [_conform_field(have[f.name], f) if f.name in have else pa.nulls(len(arr), f.type)
                        for f in target]
            return pa.StructArray.from_arrays(children, fields=list(target), mask=_validity(arr))
        if pa.types.is_list(target) or pa.types.is_large_list(target):
            if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
                raise ConformError(f"a {arr.type} cannot become {target}")
            large = pa.types.is_large_list(target)
            src = arr
            if large != pa.types.is_large_list(arr.type):
                make_type = pa.large_list if large else pa.list_
                src = arr.cast(make_type(arr.type.value_field))
            values = conform(src.values, target.value_type)
            make = pa.LargeListArray if large else pa.ListArray
            return make.from_arrays(_offsets(src), values, type=target, mask=_validity(src))
        if pa.types.is_map(target):
            if not pa.types.is_map(arr.type):
                raise ConformError(f"a {arr.type} cannot become {target}")
            keys = conform(arr.keys, target.key_type)
            items = conform(arr.items, target.item_type)
            return pa.MapArray.from_arrays(_offsets(arr), keys, items, type=target, mask=_validity(arr))
        if pa.types.is_nested(arr.type):
            raise ConformError(f"a {arr.type} cannot become {target}")
        return arr.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ConformError(f"a value the column's type {target} cannot hold ({e})") from e


def _conform_field(arr: pa.Array, f: pa.Field) -> pa.Array:
    """A struct field's values conformed; a failure names the field (its path, for nested ones)."""
    try:
        return conform(arr, f.type)
    except ConformError as e:
        raise ConformError(e.why, (f.name, *e.path)) from e


def conform_rows(arr: pa.Array, target: pa.DataType) -> tuple[pa.Array, dict[int, str]]:
    """:func:`conform`, with the rows whose values cannot be cast set to null and returned with why (the field
    path and Arrow's reason, e.g. ``field value: Failed to parse string: 'abc' as a scalar of type double``)."""
    try:
        return conform(arr, target), {}
    except ConformError:
        pass
    bad: dict[int, str] = {}
    pieces: list[pa.Array] = []
    for i in range(len(arr)):
        try:
            pieces.append(conform(arr.slice(i, 1), target))
        except ConformError as e:
            bad[i] = str(e)
            pieces.append(pa.nulls(1, target))
    return (pa.concat_arrays(pieces) if pieces else pa.nulls(0, target)), bad


def scatter(n: int, groups: Sequence[tuple[Sequence[int], pa.Array]], typ: pa.DataType) -> pa.Array:
    """One array of ``n`` rows from per-group arrays: group ``k`` holds the values of rows ``groups[k][0]`` (in
    that order); rows in no group are null."""
    position = [-1] * n
    arrays: list[pa.Array] = []
    base = 0
    for rows, values in groups:
        for j, row in enumerate(rows):
            position[row] = base + j
        arrays.append(values)
        base += len(values)
    nulls_at = base
    arrays.append(pa.nulls(1, typ))
    indices = pa.array([p if p >= 0 else nulls_at for p in position], pa.int64())
    combined = pa.concat_arrays([a if a.type == typ else a.cast(typ) for a in arrays])
    return combined.take(indices)
