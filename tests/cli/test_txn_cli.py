"""`metastore txn log`, `table files` and `table read` through click's CliRunner, against a fake
node on a real socket (tests.client.fake_node) serving canned `txn_log` / `files` / `schema_at`
answers, and real Parquet files written with pyarrow into a temporary warehouse.

What is checked: the requests each command sends (and that bad flags send none), both output
formats, the reader's schema rules (field ids over names, columns added later as NULL or as their
DEFAULT, widened types cast, name fallback only for files without field ids), the row limit
across files, and the error line and exit code of every failure (missing file, not Parquet,
uncastable column, an error reply from the node). Plus unit tests of the pure value conversions.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from cli.values import json_value, text_value
from hlc import SystemClock, make_ts, to_iso
from metastore.client import FILES_PAGE_LIMIT
from metastore.client.defaults import DefaultNotEvaluableError, default_array
from metastore.client.floors import forget_shared_floors
from metastore.client.parquet import PinnedColumn, UnsupportedSchemaError, arrow_schema, read_rows
from metastore.errors import BadRequestError, MetastoreError, TableNotFoundError
from tests.client.fake_node import TOKEN, ThreadedFakeNode

FIELD_ID: Final = b"PARQUET:field_id"
TABLE: Final = "sales.orders"
AS_OF: Final = make_ts(1_790_000_000_000, 3)
COMMIT_1: Final = make_ts(1_789_999_990_000)
COMMIT_2: Final = make_ts(1_789_999_995_000, 1)
# The newest acknowledged ts the leader names (`read_ts`): a linearizable listing waits for it.
READ_TS: Final = make_ts(1_789_999_999_000, 2)

# The schema in force at AS_OF: column 2 was renamed (amount -> total) and widened
# (FLOAT -> DOUBLE) after the files were written; column 3 was added after them.
COLUMNS: Final = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "total", "type": "DOUBLE", "nullable": True},
    {"field_id": 3, "name": "note", "type": "STRING", "nullable": True},
]

TXN_LOG: Final = {
    "commits": [
        {
            "ts": COMMIT_2,
            "tm": COMMIT_2,
            "txn_id": "stream:2",
            "tables": ["sales.orders", "sales.totals"],
            "files_added": 3,
            "files_removed": 1,
            "rows_added": 30,
        },
        {
            "ts": COMMIT_1,
            "tm": COMMIT_1,
            "txn_id": "stream:1",
            "tables": ["sales.orders"],
            "files_added": 2,
            "files_removed": 0,
            "rows_added": 20,
        },
    ],
    "upper": COMMIT_2 + 1,
}


def field(name: str, dtype: pa.DataType, field_id: int | None) -> pa.Field:
    meta = {FIELD_ID: str(field_id).encode()} if field_id is not None else None
    return pa.field(name, dtype, metadata=meta)


def write(path: Path, columns: dict[str, tuple[pa.DataType, int | None, list[Any]]]) -> int:
    """A Parquet file with these columns: name -> (type, field id or None, values)."""
    schema = pa.schema([field(name, t, fid) for name, (t, fid, _) in columns.items()])
    arrays = [pa.array(values, type=t) for t, _, values in columns.values()]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path)
    return path.stat().st_size


class Warehouse:
    """Two committed files of `sales.orders` written before the rename and the added column."""

    def __init__(self, root: Path) -> None:
        self.location = root / "sales.db" / "orders"
        self.paths = ["_txn/a/part-0.parquet", "_txn/b/part-0.parquet"]
        sizes = [
            write(
                self.location / self.paths[0],
                {
                    "id": (pa.int64(), 1, [1, 2]),
                    "amount": (pa.float32(), 2, [1.5, None]),
                },
            ),
            write(
                self.location / self.paths[1],
                {
                    # Column order in the file does not matter either.
                    "amount": (pa.float32(), 2, [3.25, 4.0]),
                    "id": (pa.int64(), 1, [3, 4]),
                },
            ),
        ]
        self.files = {
            "table": TABLE,
            "table_id": 7,
            "as_of": AS_OF,
            "version": 3,
            "location": str(self.location),
            "files": [
                {"path": p, "size_bytes": s, "row_count": 2, "added_ts": ts}
                for p, s, ts in zip(self.paths, sizes, (COMMIT_1, COMMIT_2), strict=True)
            ],
            "rows": 4,
            "size_bytes": sum(sizes),
            "waited_ms": 0.0,
        }
        self.schema_at = {
            "table": TABLE,
            "table_id": 7,
            "version": 3,
            "tm": 1,
            "tu": 2,
            "location": str(self.location),
            "schema": {"columns": COLUMNS, "ddl": "..."},
            "ts": AS_OF,
            "waited_ms": 0.0,
            "safe_time": AS_OF,
        }
        self.error: MetastoreError | None = None

    async def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        if op == "txn_log":
            return TXN_LOG
        if op == "read_ts":
            return {"ts": READ_TS, "leader_id": 1}
        if op == "files":
            return dict(self.files, as_of=args.get("as_of", AS_OF))
        if op == "schema_at":
            return self.schema_at
        raise AssertionError(f"unexpected op {op}")


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("METASTORE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def warehouse(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "warehouse")


@pytest.fixture
def node(warehouse: Warehouse) -> Iterator[ThreadedFakeNode]:
    with ThreadedFakeNode(handler=warehouse.handle) as fake:
        yield fake


def run(node: ThreadedFakeNode, *args: str) -> Result:
    # Each `metastore` invocation is a process of its own: no read floor of an earlier one
    # carries over (the client library shares them within a process).
    forget_shared_floors()
    result = CliRunner().invoke(
        cli, ["--endpoints", node.endpoint, "--token", TOKEN, *args], prog_name="metastore"
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def sent(node: ThreadedFakeNode) -> list[tuple[str, dict[str, Any]]]:
    return [(op, a) for _, op, a in node.node.requests]


def assert_error(result: Result, exit_code: int, code: str) -> None:
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"Error: {code}: "), result.stderr
    assert result.stdout == ""


# ---- txn log ---------------------------------------------------------------------------------


def test_txn_log_json_is_the_result_and_limit_defaults_to_20(node: ThreadedFakeNode) -> None:
    result = run(node, "-o", "json", "txn", "log", "--consistency", "s")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == TXN_LOG
    assert (
        run(node, "-o", "json", "txn", "log", "--limit", "5", "--consistency", "s").exit_code == 0
    )
    assert sent(node) == [("txn_log", {"limit": 20}), ("txn_log", {"limit": 5})]


def test_txn_log_is_linearizable_by_default(node: ThreadedFakeNode) -> None:
    """As `table files`: the leader's read_ts first, then the list from a node whose safe
    time reached it (`min_ts`), so a commit acknowledged a moment ago through another node
    is listed. The README said so; the command listed what the node asked had applied."""
    result = run(node, "-o", "json", "txn", "log")
    assert result.exit_code == 0, result.stderr
    assert sent(node) == [("read_ts", {}), ("txn_log", {"limit": 20, "min_ts": READ_TS})]


def test_txn_log_table_shows_iso_times_tables_and_file_counts(node: ThreadedFakeNode) -> None:
    result = run(node, "txn", "log")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for shown in (
        to_iso(COMMIT_2),  # with its logical counter: the exact commit timestamp
        to_iso(COMMIT_1),
        "stream:2",
        "sales.orders, sales.totals",
        "+3 -1",
        "+2 ",
        "30",
        "upper (next usable commit ts): " + to_iso(COMMIT_2 + 1),
    ):
        assert shown in out, (shown, out)
    assert out.index("stream:2") < out.index("stream:1")  # newest first, as the node sent them


@pytest.mark.parametrize("limit", ["0", "10001", "x"])
def test_txn_log_bad_limit_is_a_usage_error_and_sends_nothing(
    node: ThreadedFakeNode, limit: str
) -> None:
    result = run(node, "txn", "log", "--limit", limit)
    assert result.exit_code == 2
    assert sent(node) == []


# ---- table files -----------------------------------------------------------------------------


def test_table_files_sends_the_as_of_it_parsed(node: ThreadedFakeNode) -> None:
    before_ms = SystemClock().now_ms()
    assert run(node, "-o", "json", "table", "files", TABLE).exit_code == 0
    assert run(node, "-o", "json", "table", "files", TABLE, "--as-of", str(AS_OF)).exit_code == 0
    assert run(node, "table", "files", TABLE, "--as-of", "-5m").exit_code == 0
    assert run(node, "-o", "json", "table", "files", TABLE, "--consistency", "s").exit_code == 0
    (asked, _), (_, now), (_, exact), (_, relative), (_, serializable) = sent(node)
    # Linearizable by default: the leader's newest acknowledged ts first, then read at least
    # there; `--as-of` and `--consistency s` skip that round trip.
    assert asked == "read_ts"
    assert now == {"table": TABLE, "min_ts": READ_TS, "limit": FILES_PAGE_LIMIT}  # it pages
    assert serializable == {"table": TABLE, "limit": FILES_PAGE_LIMIT}
    assert exact == {"table": TABLE, "as_of": AS_OF, "limit": FILES_PAGE_LIMIT}
    five_min_ago_ms = relative["as_of"] >> 16
    assert before_ms - 300_000 <= five_min_ago_ms <= SystemClock().now_ms() - 300_000


def test_table_files_outputs(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    result = run(node, "-o", "json", "table", "files", TABLE)
    assert json.loads(result.stdout) == warehouse.files
    text = run(node, "table", "files", TABLE).stdout
    for shown in (
        *warehouse.paths,
        to_iso(COMMIT_1),
        to_iso(AS_OF),
        str(warehouse.location),
        "total: 2 files",
        str(warehouse.files["size_bytes"]),
    ):
        assert shown in text, (shown, text)


def test_table_files_error_reply(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    warehouse.error = TableNotFoundError("table sales.nope does not exist")
    assert_error(run(node, "table", "files", "sales.nope"), 4, "TABLE_NOT_FOUND")


# ---- table read ------------------------------------------------------------------------------


def test_read_pins_the_files_timestamp_for_the_schema(node: ThreadedFakeNode) -> None:
    assert run(node, "-o", "json", "table", "read", TABLE).exit_code == 0
    assert run(node, "-o", "json", "table", "read", TABLE, "--as-of", "12345").exit_code == 0
    assert sent(node) == [
        ("read_ts", {}),
        ("files", {"table": TABLE, "min_ts": READ_TS, "limit": FILES_PAGE_LIMIT}),
        ("schema_at", {"table": TABLE, "ts": AS_OF}),  # the timestamp the files answer names
        ("files", {"table": TABLE, "as_of": 12345, "limit": FILES_PAGE_LIMIT}),
        ("schema_at", {"table": TABLE, "ts": 12345}),
    ]


def test_read_matches_by_field_id_casts_and_fills_added_columns(node: ThreadedFakeNode) -> None:
    doc = json.loads(run(node, "-o", "json", "table", "read", TABLE).stdout)
    assert doc == {
        "table": TABLE,
        "as_of": AS_OF,
        "version": 3,
        "columns": ["id", "total", "note"],
        "rows": [
            {"id": 1, "total": 1.5, "note": None},
            {"id": 2, "total": None, "note": None},
            {"id": 3, "total": 3.25, "note": None},
            {"id": 4, "total": 4.0, "note": None},
        ],
        "rows_shown": 4,
        "rows_total": 4,
        "files": 2,
        "truncated": False,
    }


def test_read_limit_stops_inside_the_second_file(node: ThreadedFakeNode) -> None:
    doc = json.loads(run(node, "-o", "json", "table", "read", TABLE, "--limit", "3").stdout)
    assert [r["id"] for r in doc["rows"]] == [1, 2, 3]
    assert doc["rows_shown"] == 3 and doc["truncated"] is True
    one = json.loads(run(node, "-o", "json", "table", "read", TABLE, "--limit", "1").stdout)
    assert one["rows"] == [{"id": 1, "total": 1.5, "note": None}]


def test_read_table_output(node: ThreadedFakeNode) -> None:
    result = run(node, "table", "read", TABLE, "--limit", "3")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"{TABLE} v3 as of {to_iso(AS_OF)}: 3 of 4 rows (2 files)" in out
    assert "total" in out and "note" in out and "NULL" in out and "3.25" in out
    assert "\x1b[" not in out


@pytest.mark.parametrize("limit", ["0", "10001"])
def test_read_bad_limit_is_a_usage_error(node: ThreadedFakeNode, limit: str) -> None:
    assert run(node, "table", "read", TABLE, "--limit", limit).exit_code == 2
    assert sent(node) == []


def test_read_missing_file_names_it(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    (warehouse.location / warehouse.paths[1]).unlink()
    result = run(node, "table", "read", TABLE)
    assert_error(result, 4, "DATA_FILE_NOT_FOUND")
    assert warehouse.paths[1] in result.stderr
    # The first file alone satisfies a limit of 2: the missing one is never opened.
    assert run(node, "table", "read", TABLE, "--limit", "2").exit_code == 0


def test_read_file_that_is_not_parquet(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    (warehouse.location / warehouse.paths[0]).write_bytes(b"not parquet at all")
    assert_error(run(node, "table", "read", TABLE), 1, "DATA_FILE_UNREADABLE")


def test_read_column_that_cannot_be_cast(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    write(warehouse.location / warehouse.paths[0], {"id": (pa.string(), 1, ["a", "b"])})
    result = run(node, "table", "read", TABLE)
    assert_error(result, 1, "DATA_FILE_UNREADABLE")
    assert "cannot be read as id int64" in result.stderr


def test_read_error_reply_from_the_node(node: ThreadedFakeNode, warehouse: Warehouse) -> None:
    warehouse.error = TableNotFoundError("table sales.nope does not exist")
    assert_error(run(node, "table", "read", "sales.nope"), 4, "TABLE_NOT_FOUND")


# ---- the reader's rules, directly ------------------------------------------------------------


def pinned(*columns: tuple[int, str, str]) -> list[PinnedColumn]:
    return [
        PinnedColumn(field_id=fid, name=name, type_sql=t, nullable=True) for fid, name, t in columns
    ]


def test_files_without_field_ids_match_by_name_case_insensitively(tmp_path: Path) -> None:
    write(
        tmp_path / "f.parquet", {"ID": (pa.int32(), None, [7]), "Note": (pa.string(), None, ["n"])}
    )
    files = [{"path": "f.parquet"}]
    columns = pinned((1, "id", "BIGINT"), (2, "note", "STRING"), (3, "later", "INT"))
    rows = read_rows(str(tmp_path), files, columns, limit=5).rows.to_pylist()
    assert rows == [{"id": 7, "note": "n", "later": None}]


def test_a_file_with_field_ids_is_never_matched_by_name(tmp_path: Path) -> None:
    # Field id 9 is a dropped column; a new column reusing its name must not pick up its data.
    write(tmp_path / "f.parquet", {"id": (pa.int64(), 1, [1]), "note": (pa.string(), 9, ["old"])})
    columns = pinned((1, "id", "BIGINT"), (4, "note", "STRING"))
    rows = read_rows(str(tmp_path), [{"path": "f.parquet"}], columns, limit=5).rows.to_pylist()
    assert rows == [{"id": 1, "note": None}]


def test_a_file_none_of_whose_columns_survive_reads_as_nulls(tmp_path: Path) -> None:
    write(tmp_path / "f.parquet", {"gone": (pa.int64(), 5, [1, 2, 3])})
    columns = pinned((6, "fresh", "STRING"))
    read = read_rows(str(tmp_path), [{"path": "f.parquet"}], columns, limit=2)
    assert read.rows.to_pylist() == [{"fresh": None}, {"fresh": None}]
    assert read.files_opened == 1


def test_rows_of_files_older_than_a_column_read_its_default(tmp_path: Path) -> None:
    # f1 predates ADD COLUMN n INT DEFAULT 42 (no field id 2); f2 was written after and stores
    # a NULL and a 7 in it, which must stay as they are.
    write(tmp_path / "f1.parquet", {"id": (pa.int64(), 1, [1, 2])})
    write(tmp_path / "f2.parquet", {"id": (pa.int64(), 1, [3, 4]), "n": (pa.int32(), 2, [None, 7])})
    columns = [
        PinnedColumn(field_id=1, name="id", type_sql="BIGINT", nullable=True),
        PinnedColumn(field_id=2, name="n", type_sql="INT", nullable=True, default_sql="40 + 2"),
        PinnedColumn(field_id=3, name="s", type_sql="STRING", nullable=True),  # no default
    ]
    files = [{"path": "f1.parquet"}, {"path": "f2.parquet"}]
    rows = read_rows(str(tmp_path), files, columns, limit=10).rows.to_pylist()
    assert rows == [
        {"id": 1, "n": 42, "s": None},
        {"id": 2, "n": 42, "s": None},
        {"id": 3, "n": None, "s": None},
        {"id": 4, "n": 7, "s": None},
    ]
    assert PinnedColumn.from_wire(
        {"field_id": 2, "name": "n", "type": "INT", "nullable": True, "default": "42"}
    ) == PinnedColumn(field_id=2, name="n", type_sql="INT", nullable=True, default_sql="42")


def test_a_default_this_reader_cannot_evaluate_is_an_error_not_a_null(tmp_path: Path) -> None:
    write(tmp_path / "f1.parquet", {"id": (pa.int64(), 1, [1])})
    columns = [
        PinnedColumn(field_id=1, name="id", type_sql="BIGINT", nullable=True),
        PinnedColumn(
            field_id=2, name="d", type_sql="DATE", nullable=True, default_sql="current_date()"
        ),
    ]
    with pytest.raises(UnsupportedSchemaError, match="current_date"):
        read_rows(str(tmp_path), [{"path": "f1.parquet"}], columns, limit=10)


@pytest.mark.parametrize(
    ("default_sql", "arrow_type", "value"),
    [
        ("42", pa.int32(), 42),
        ("-5", pa.int64(), -5),
        ("40 + 2", pa.int64(), 42),
        ("-(3 - 1) * 2", pa.int32(), -4),
        ("1.5", pa.float64(), 1.5),
        ("1.5", pa.decimal128(10, 2), Decimal("1.50")),
        ("1.5e3", pa.float64(), 1500.0),
        ("'abc'", pa.string(), "abc"),
        ("'it' 's'", pa.string(), "its"),  # adjacent literals concatenate, as in Spark
        ("TRUE", pa.bool_(), True),
        ("NULL", pa.int32(), None),
        ("X'AB01'", pa.binary(), b"\xab\x01"),
        ("DATE '2020-01-02'", pa.date32(), dt.date(2020, 1, 2)),
        (
            "TIMESTAMP_NTZ '2020-01-02 03:04:05'",
            pa.timestamp("us"),
            dt.datetime(2020, 1, 2, 3, 4, 5),
        ),
        (
            "TIMESTAMP '2020-01-02 03:04:05+01:00'",
            pa.timestamp("us", tz="UTC"),
            dt.datetime(2020, 1, 2, 2, 4, 5, tzinfo=dt.UTC),
        ),
        ("CAST(5 AS BIGINT)", pa.int64(), 5),
        ("CAST('1.25' AS DECIMAL(10, 2))", pa.decimal128(12, 2), Decimal("1.25")),
        ("ARRAY(1, 2)", pa.list_(pa.int64()), [1, 2]),
    ],
)
def test_existence_defaults_evaluate_like_spark(
    default_sql: str, arrow_type: pa.DataType, value: object
) -> None:
    assert default_array(default_sql, arrow_type, 2).to_pylist() == [value, value]


@pytest.mark.parametrize(
    ("default_sql", "arrow_type"),
    [
        ("current_date()", pa.date32()),  # Spark evaluates it; this reader will not guess
        ("3000000000", pa.int32()),  # does not fit the column
        ("2147483647 + 1", pa.int32()),  # overflow, as in Spark's ANSI mode
        ("'abc'", pa.int32()),
        ("10 / 4", pa.float64()),
        ("uuid()", pa.string()),
        ("((", pa.int32()),
        # Spark: seconds since the epoch (1704067200); Arrow's cast gave microseconds.
        ("CAST(TIMESTAMP '2024-01-01 00:00:00Z' AS BIGINT)", pa.int64()),
        ("TIMESTAMP '2024-01-01 00:00:00Z'", pa.float64()),
        ("CAST(86400 AS TIMESTAMP)", pa.timestamp("us", tz="UTC")),  # Spark: 1970-01-02
        ("DATE '2024-01-01'", pa.int32()),  # Spark refuses; Arrow gave days since the epoch
        # Spark renders a double as 1000.0 and 1.5E300; Arrow as 1000 and 1.5e+300.
        ("1e3", pa.string()),
        ("CAST(1.5 AS DOUBLE)", pa.string()),
        # Spark converts these in its session time zone, Arrow in UTC. A zone-less TIMESTAMP
        # read as UTC here and in the session time zone by Spark (the DDL refuses it now; older
        # tables may have one).
        ("TIMESTAMP '2020-01-02 03:04:05'", pa.timestamp("us", tz="UTC")),
        ("'2020-01-02'", pa.timestamp("us", tz="UTC")),
        ("CAST(TIMESTAMP '2024-01-01 23:30:00Z' AS DATE)", pa.date32()),
        ("DATE '2024-01-01'", pa.timestamp("us", tz="UTC")),
        ("TIMESTAMP '2024-01-01 00:00:00Z'", pa.timestamp("us")),
        ("TIMESTAMP '2024-01-01 00:00:00Z'", pa.string()),
    ],
)
def test_defaults_that_cannot_be_evaluated_exactly_are_refused(
    default_sql: str, arrow_type: pa.DataType
) -> None:
    with pytest.raises(DefaultNotEvaluableError, match="DEFAULT"):
        default_array(default_sql, arrow_type, 1)


def test_rich_types_read_and_convert_to_json(tmp_path: Path) -> None:
    when = dt.datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=dt.UTC)
    write(
        tmp_path / "f.parquet",
        {
            "d": (pa.decimal128(10, 2), 1, [Decimal("12.34")]),
            "t": (pa.timestamp("us", tz="UTC"), 2, [when]),
            "day": (pa.date32(), 3, [dt.date(2026, 11, 22)]),
            "m": (pa.map_(pa.string(), pa.int32()), 4, [[("a", 1)]]),
            "tags": (pa.list_(pa.string()), 5, [["x", "y"]]),
            "s": (pa.struct([("k", pa.int32())]), 6, [{"k": 5}]),
            "b": (pa.binary(), 7, [b"\x00\x01"]),
            "small": (pa.int16(), 8, [3]),
        },
    )
    columns = pinned(
        (1, "d", "DECIMAL(12,2)"),  # widened precision
        (2, "t", "TIMESTAMP"),
        (3, "day", "DATE"),
        (4, "m", "MAP<STRING, BIGINT>"),
        (5, "tags", "ARRAY<STRING>"),
        (6, "s", "STRUCT<k: BIGINT>"),
        (7, "b", "BINARY"),
        (8, "small", "INT"),
    )
    rows = read_rows(str(tmp_path), [{"path": "f.parquet"}], columns, limit=1).rows.to_pylist()
    assert {k: json_value(v) for k, v in rows[0].items()} == {
        "d": "12.34",
        "t": "2026-11-22T10:00:00.123000+00:00",
        "day": "2026-11-22",
        "m": {"a": 1},
        "tags": ["x", "y"],
        "s": {"k": 5},
        "b": base64.b64encode(b"\x00\x01").decode(),
        "small": 3,
    }


def test_arrow_schema_carries_types_nullability_and_field_ids() -> None:
    schema = arrow_schema(
        [
            PinnedColumn(field_id=4, name="v", type_sql="VARCHAR(5)", nullable=False),
            PinnedColumn(field_id=5, name="ts", type_sql="TIMESTAMP_NTZ", nullable=True),
        ]
    )
    assert schema.field("v").type == pa.string() and not schema.field("v").nullable
    assert schema.field("v").metadata == {FIELD_ID: b"4"}
    assert schema.field("ts").type == pa.timestamp("us")


@pytest.mark.parametrize(
    ("value", "as_json", "as_text"),
    [
        (None, None, "NULL"),
        (True, True, "true"),
        (1.5, 1.5, "1.5"),
        (float("nan"), "nan", "nan"),
        (float("inf"), "inf", "inf"),
        (Decimal("1.10"), "1.10", "1.10"),
        ([(1, "a")], [{"key": 1, "value": "a"}], '[{"key": 1, "value": "a"}]'),
        ({"k": [1, None]}, {"k": [1, None]}, '{"k": [1, null]}'),
        (dt.date(2026, 1, 2), "2026-01-02", "2026-01-02"),
    ],
)
def test_value_conversions(value: object, as_json: object, as_text: str) -> None:
    assert json_value(value) == as_json
    assert text_value(value) == as_text
    json.dumps(json_value(value), allow_nan=False)  # always valid JSON


def test_txn_log_follows_pages_cut_short_by_wide_commits() -> None:
    """A txn_log page ends past a byte budget (wide commits): the client asks for the rest
    with its token instead of showing fewer commits than --limit."""
    commits = [dict(TXN_LOG["commits"][0], tm=100 - i, txn_id=f"t{i}") for i in range(5)]

    async def handle(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "read_ts":
            return {"ts": READ_TS, "leader_id": 1}
        assert op == "txn_log"
        before = int(args.get("page_token", 1_000))
        rest = [c for c in commits if c["tm"] < before][: min(2, args["limit"])]
        token = str(rest[-1]["tm"]) if len(rest) < min(args["limit"], 5) else None
        return {"commits": rest, "upper": 7, "next_page_token": token}

    with ThreadedFakeNode(handler=handle) as fake:
        result = run(fake, "-o", "json", "txn", "log", "--limit", "4")
        assert result.exit_code == 0, result.stderr
        assert [c["txn_id"] for c in json.loads(result.stdout)["commits"]] == [
            "t0",
            "t1",
            "t2",
            "t3",
        ]
        assert [a.get("page_token") for op, a in sent(fake) if op == "txn_log"] == [None, "99"]


def test_txn_log_from_a_node_of_an_older_release_lists_what_it_has() -> None:
    """During a rolling upgrade a node may not know `min_ts`: it refuses the argument, and
    the client asks again without it (that node's list, as before) instead of failing."""

    async def handle(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "read_ts":
            return {"ts": READ_TS, "leader_id": 1}
        if "min_ts" in args:
            raise BadRequestError("unknown arguments ['min_ts']; allowed: ['limit']")
        return TXN_LOG

    with ThreadedFakeNode(handler=handle) as fake:
        result = run(fake, "-o", "json", "txn", "log")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout) == TXN_LOG
        assert [op for op, _ in sent(fake)] == ["read_ts", "txn_log", "txn_log"]
