"""Values inside structs, lists and maps of Arrow columns, as Spark treats them in a table's rows:
the CHAR(n)/VARCHAR(n) strings nested anywhere in a column (`map_strings`: the data source's
writer checks and pads them, the shared Parquet reader pads CHAR on read) and the NOT NULL struct
fields a row carries NULL into (`null_paths`: the data source's writer refuses such a batch).

Key idea
    A column's metastore type (`metastore.types`) says where its CHAR/VARCHAR values and NOT NULL
    fields are; its Arrow array (the type `metastore.client.parquet.arrow_type` gives it) is
    walked along the same path: a struct by its fields, a list by its values, a map by its keys
    and items. The leaves are changed with pyarrow compute kernels on whole arrays, never row by
    row in Python, and the arrays are put back together around them with the same offsets,
    validity and field types (names, nullability), so only the leaf values change.

Paths name a nested value as Spark's table writes name it (and `spark_bridge.conform` does):
`s.a` for field `a` of column `s`, `l.element` for a list's values, `m.key` and `m.value` for a
map's. Only a field of a struct that is there is a NULL in it: a NULL struct (list element, map
value) holds no field, as Spark checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from metastore import types as M

Leaf: TypeAlias = Callable[[pa.Array, M.VarcharType | M.CharType, str], pa.Array]
# Called with (path, key type, key) for a map two of whose keys are equal once `leaf` changed
# them ('a' and 'a ' padded to a CHAR(3)): raises (Spark's DUPLICATED_MAP_KEY).
EqualKeys: TypeAlias = Callable[[str, M.DataType, object], None]


def has_strings(dtype: M.DataType) -> bool:
    """Whether `dtype` holds a VARCHAR(n) or CHAR(n), at the top or nested."""
    return M.contains_type(dtype, (M.VarcharType, M.CharType))


def map_strings(
    column: pa.Array | pa.ChunkedArray,
    dtype: M.DataType,
    leaf: Leaf,
    path: str,
    *,
    equal_keys: EqualKeys | None = None,
    last_key_wins: bool = False,
) -> pa.Array | pa.ChunkedArray:
    """`column` (of the metastore type `dtype`, at `path`) with `leaf(values, type, path)`
    applied to the values of each VARCHAR(n)/CHAR(n) in it; `column` itself when it holds
    none. `leaf` gets a string array and must return one of the same length.

    A map whose keys `leaf` changed may then hold two equal keys ('a' and 'a ' padded to a
    CHAR(3)), which Spark's table writes treat by `spark.sql.mapKeyDedupPolicy`: a writer passes
    `equal_keys` (called for the first such map, to raise: EXCEPTION, the default) or
    `last_key_wins` (LAST_WIN: one entry per key, where it first stood, with the last one's
    value, as Spark's map builder keeps it). Neither: kept as they are (the readers)."""
    if not has_strings(dtype):
        return column
    dedup = _Dedup(equal_keys, last_key_wins)
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array(
            [_map_array(chunk, dtype, leaf, path, dedup) for chunk in column.chunks],
            type=column.type,
        )
    return _map_array(column, dtype, leaf, path, dedup)


class _Dedup:
    """What `map_strings` does about map keys made equal (see there)."""

    __slots__ = ("equal_keys", "last_key_wins")

    def __init__(self, equal_keys: EqualKeys | None, last_key_wins: bool) -> None:
        self.equal_keys = equal_keys
        self.last_key_wins = last_key_wins

    @property
    def active(self) -> bool:
        return self.equal_keys is not None or self.last_key_wins


def _hashable(value: object) -> object:
    """A map key's Python value (a string, a struct's dict, a list) as a dict key."""
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _without_equal_keys(
    array: pa.MapArray,
    offsets: pa.Array,
    keys: pa.Array,
    items: pa.Array,
    key_type: M.DataType,
    path: str,
    dedup: _Dedup,
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(offsets, keys, items) of the map column `array` rebuilt from its mapped `keys` (and
    `items`), each map's equal keys refused or made one (`dedup`). Row by row in Python, but
    only for maps whose keys hold a CHAR/VARCHAR (where a key may have changed)."""
    starts = offsets.to_pylist()
    key_values = keys.to_pylist()
    valid = array.is_valid().to_pylist()
    key_at: list[int] = []
    item_at: list[int] = []
    new_offsets = [0]
    for row in range(len(array)):
        if valid[row]:
            where: dict[object, int] = {}
            for i in range(starts[row], starts[row + 1]):
                seen = _hashable(key_values[i])
                first = where.get(seen)
                if first is None:
                    where[seen] = len(key_at)
                    key_at.append(i)
                    item_at.append(i)
                    continue
                if dedup.equal_keys is not None:
                    dedup.equal_keys(path, key_type, key_values[i])
                item_at[first] = i  # LAST_WIN: the first one's place, the last one's value
        new_offsets.append(len(key_at))
    if len(key_at) == len(key_values):
        return offsets, keys, items
    return (
        pa.array(new_offsets, offsets.type),
        keys.take(pa.array(key_at, pa.int64())),
        items.take(pa.array(item_at, pa.int64())),
    )


def _list_parts(array: pa.ListArray | pa.MapArray) -> tuple[pa.Array, int, int]:
    """The offsets of `array` rebased to 0, and the (start, length) of the child values its
    rows refer to: a sliced list's children are not sliced with it."""
    offsets = array.offsets
    start = offsets[0].as_py() if len(offsets) else 0
    end = offsets[-1].as_py() if len(offsets) else 0
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), start, end - start


def _map_array(
    array: pa.Array, dtype: M.DataType, leaf: Leaf, path: str, dedup: _Dedup
) -> pa.Array:
    if not has_strings(dtype):
        return array
    match dtype:
        case M.VarcharType() | M.CharType():
            return leaf(array, dtype, path)
        case M.StructType(fields=fields):
            children = [
                _map_array(array.field(i), f.type, leaf, f"{path}.{f.name}", dedup)
                for i, f in enumerate(fields)
            ]
            return pa.StructArray.from_arrays(
                children, fields=list(array.type), mask=array.is_null()
            )
        case M.ArrayType(element=element):
            offsets, start, length = _list_parts(array)
            values = _map_array(
                array.values.slice(start, length), element, leaf, f"{path}.element", dedup
            )
            return pa.ListArray.from_arrays(offsets, values, type=array.type, mask=array.is_null())
        case M.MapType(key=key, value=value):
            offsets, start, length = _list_parts(array)
            keys = _map_array(array.keys.slice(start, length), key, leaf, f"{path}.key", dedup)
            items = _map_array(
                array.items.slice(start, length), value, leaf, f"{path}.value", dedup
            )
            if dedup.active and has_strings(key):
                offsets, keys, items = _without_equal_keys(
                    array, offsets, keys, items, key, path, dedup
                )
            return pa.MapArray.from_arrays(
                offsets, keys, items, type=array.type, mask=array.is_null()
            )
    return array


def null_paths(column: pa.Array | pa.ChunkedArray, dtype: M.DataType, path: str) -> list[str]:
    """The NOT NULL struct fields inside `column` (of the metastore type `dtype`, at `path`)
    that some row carries NULL into, by path: in a struct that is there, in any element of a
    list, key or value of a map. The column's own nullability is the caller's to check."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    found: list[str] = []
    for chunk in chunks:
        for p in _null_paths(chunk, dtype, path):
            if p not in found:
                found.append(p)
    return found


def _null_paths(array: pa.Array, dtype: M.DataType, path: str) -> list[str]:
    found: list[str] = []
    match dtype:
        case M.StructType(fields=fields):
            present = array.is_valid()
            for i, f in enumerate(fields):
                child = array.field(i)
                field_path = f"{path}.{f.name}"
                if not f.nullable and pc.any(pc.and_(present, child.is_null())).as_py():
                    found.append(field_path)
                # A NULL struct's fields are NULL too: only the rows where it is there count.
                found.extend(_null_paths(child.filter(present), f.type, field_path))
        case M.ArrayType(element=element):
            _, start, length = _list_parts(array)
            found.extend(_null_paths(array.values.slice(start, length), element, f"{path}.element"))
        case M.MapType(key=key, value=value):
            _, start, length = _list_parts(array)
            found.extend(_null_paths(array.keys.slice(start, length), key, f"{path}.key"))
            found.extend(_null_paths(array.items.slice(start, length), value, f"{path}.value"))
    return found


def with_nested_nullability(array: pa.Array, target: pa.DataType) -> pa.Array:
    """`array` (of `target`'s layout and types, nested fields maybe nullable where `target`'s
    are not) as an array of `target`, rebuilt around the same children, validity and offsets.
    For a file that holds a NOT NULL nested field as nullable (the bridge's Spark writes the
    output's nullability; writers check the values): under a NULL struct or list element its
    slots are NULL, which pyarrow's cast and view refuse for a NOT NULL field, though no row
    holds a NULL there."""
    if array.type == target:
        return array
    if pa.types.is_struct(target):
        children = [with_nested_nullability(array.field(i), f.type) for i, f in enumerate(target)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    if pa.types.is_map(target):
        offsets, start, length = _list_parts(array)
        keys = with_nested_nullability(array.keys.slice(start, length), target.key_type)
        items = with_nested_nullability(array.items.slice(start, length), target.item_type)
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=array.is_null())
    if pa.types.is_list(target):
        offsets, start, length = _list_parts(array)
        values = with_nested_nullability(array.values.slice(start, length), target.value_type)
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=array.is_null())
    return array
