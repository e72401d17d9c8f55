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


def has_strings(dtype: M.DataType) -> bool:
    """Whether `dtype` holds a VARCHAR(n) or CHAR(n), at the top or nested."""
    return M.contains_type(dtype, (M.VarcharType, M.CharType))


def map_strings(
    column: pa.Array | pa.ChunkedArray, dtype: M.DataType, leaf: Leaf, path: str
) -> pa.Array | pa.ChunkedArray:
    """`column` (of the metastore type `dtype`, at `path`) with `leaf(values, type, path)`
    applied to the values of each VARCHAR(n)/CHAR(n) in it; `column` itself when it holds
    none. `leaf` gets a string array and must return one of the same length."""
    if not has_strings(dtype):
        return column
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array(
            [_map_array(chunk, dtype, leaf, path) for chunk in column.chunks], type=column.type
        )
    return _map_array(column, dtype, leaf, path)


def _list_parts(array: pa.ListArray | pa.MapArray) -> tuple[pa.Array, int, int]:
    """The offsets of `array` rebased to 0, and the (start, length) of the child values its
    rows refer to: a sliced list's children are not sliced with it."""
    offsets = array.offsets
    start = offsets[0].as_py() if len(offsets) else 0
    end = offsets[-1].as_py() if len(offsets) else 0
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), start, end - start


def _map_array(array: pa.Array, dtype: M.DataType, leaf: Leaf, path: str) -> pa.Array:
    if not has_strings(dtype):
        return array
    match dtype:
        case M.VarcharType() | M.CharType():
            return leaf(array, dtype, path)
        case M.StructType(fields=fields):
            children = [
                _map_array(array.field(i), f.type, leaf, f"{path}.{f.name}")
                for i, f in enumerate(fields)
            ]
            return pa.StructArray.from_arrays(
                children, fields=list(array.type), mask=array.is_null()
            )
        case M.ArrayType(element=element):
            offsets, start, length = _list_parts(array)
            values = _map_array(array.values.slice(start, length), element, leaf, f"{path}.element")
            return pa.ListArray.from_arrays(offsets, values, type=array.type, mask=array.is_null())
        case M.MapType(key=key, value=value):
            offsets, start, length = _list_parts(array)
            keys = _map_array(array.keys.slice(start, length), key, leaf, f"{path}.key")
            items = _map_array(array.items.slice(start, length), value, leaf, f"{path}.value")
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
