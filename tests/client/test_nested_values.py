"""`metastore.client.nested_values`: CHAR/VARCHAR values and NOT NULL fields found inside structs,
lists and maps of Arrow columns, sliced and chunked ones too (a reader's batches are slices)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metastore import types as M
from metastore.client.nested_values import has_strings, map_strings, null_paths
from metastore.client.parquet import arrow_type


def _upper(values: pa.Array, dtype: M.VarcharType | M.CharType, path: str) -> pa.Array:
    return pc.utf8_upper(values)


def test_map_strings_changes_only_the_char_and_varchar_values_at_their_paths() -> None:
    dtype = M.parse_type("STRUCT<c: CHAR(3), n: STRING, l: ARRAY<MAP<VARCHAR(2), CHAR(1)>>>")
    rows = [
        {"c": "a", "n": "b", "l": [[("k", "v")], None]},
        None,
        {"c": None, "n": "x", "l": None},
    ]
    column = pa.array(rows, type=arrow_type(dtype))
    seen: list[str] = []

    def leaf(values: pa.Array, t: M.VarcharType | M.CharType, path: str) -> pa.Array:
        seen.append(path)
        return _upper(values, t, path)

    out = map_strings(column, dtype, leaf, "s")
    assert out.type == column.type
    assert out.to_pylist() == [
        {"c": "A", "n": "b", "l": [[("K", "V")], None]},
        None,
        {"c": None, "n": "x", "l": None},
    ]
    assert sorted(seen) == ["s.c", "s.l.element.key", "s.l.element.value"]
    # Slices (a batch of a larger array) and chunks keep their rows.
    assert map_strings(column.slice(2, 1), dtype, _upper, "s").to_pylist() == [out[2].as_py()]
    chunked = pa.chunked_array([column.slice(0, 1), column.slice(1, 2)])
    assert map_strings(chunked, dtype, _upper, "s").to_pylist() == out.to_pylist()
    # Nothing to change: the same column.
    plain = M.parse_type("ARRAY<STRING>")
    assert not has_strings(plain)
    strings = pa.array([["a"]], type=arrow_type(plain))
    assert map_strings(strings, plain, _upper, "p") is strings


def test_null_paths_finds_nulls_only_in_structs_that_are_there() -> None:
    dtype = M.parse_type("ARRAY<STRUCT<a: INT NOT NULL, b: STRUCT<c: INT NOT NULL>>>")
    typ = arrow_type(dtype)
    clean = [[{"a": 1, "b": None}, None], None, []]
    assert null_paths(pa.array(clean, type=typ), dtype, "l") == []
    dirty = [[{"a": 1, "b": {"c": 1}}], [{"a": None, "b": {"c": None}}]]
    assert null_paths(pa.array(dirty, type=typ), dtype, "l") == ["l.element.a", "l.element.b.c"]
    # The dirty row sliced away is not looked at.
    assert null_paths(pa.array(dirty, type=typ).slice(0, 1), dtype, "l") == []
    mapped = M.parse_type("MAP<STRING, STRUCT<y: INT NOT NULL>>")
    column = pa.chunked_array(
        [
            pa.array([[("k", {"y": 1})]], type=arrow_type(mapped)),
            pa.array([[("k", {"y": None})]], type=arrow_type(mapped)),
        ]
    )
    assert null_paths(column, mapped, "m") == ["m.value.y"]


def _pad3(values: pa.Array, t: M.VarcharType | M.CharType, path: str) -> pa.Array:
    return pc.utf8_rpad(values, width=3, padding=" ")


def test_map_keys_made_equal_are_refused_or_the_last_one_kept_as_spark_does() -> None:
    """Spark's map builder under LAST_WIN keeps one entry per key where it first stood, with the
    last one's value; under EXCEPTION (the writers' `equal_keys`) the first collision raises.
    Sliced arrays (a reader's batches) and NULL maps keep their rows."""
    dtype = M.parse_type("ARRAY<MAP<CHAR(3), INT>>")
    rows = [
        [[("z", 0)]],
        [[("x", 1), ("y", 5), ("x ", 2)], None],
        None,
        [[("q", 1), ("q  ", 9), ("r", 3)]],
    ]
    column = pa.array(rows, type=arrow_type(dtype)).slice(1)
    kept = map_strings(column, dtype, _pad3, "l", last_key_wins=True)
    assert kept.to_pylist() == [
        [[("x  ", 2), ("y  ", 5)], None],
        None,
        [[("q  ", 9), ("r  ", 3)]],
    ]
    seen: list[tuple[str, str, object]] = []

    def refuse(path: str, key_type: M.DataType, key: object) -> None:
        seen.append((path, key_type.to_sql(), key))
        raise ValueError(path)

    with pytest.raises(ValueError, match=r"^l\.element$"):
        map_strings(column, dtype, _pad3, "l", equal_keys=refuse)
    assert seen == [("l.element", "CHAR(3)", "x  ")]
    # Readers pass neither: the keys as they are.
    assert map_strings(column, dtype, _pad3, "l").to_pylist()[0][0] == [
        ("x  ", 1),
        ("y  ", 5),
        ("x  ", 2),
    ]
