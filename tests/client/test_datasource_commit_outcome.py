"""A `df.write.format("metastore")` append whose commit's outcome is unknown, or whose txn id
was committed before: the commit is looked up (linearizably) before the job is failed or
reported done. Found committed with this append's table, the job succeeded (a re-run would
write the rows twice); found committed with another table, the id was reused for another write
(a typed TxnIdReused, not "done": that dropped this append's rows silently); not found, the
append's session is closed (so the commit can no longer land) and the commit looked up again,
which settles it; unsettled, the error names the txn id to re-run under (a txn id commits at
most once). Pure: a scripted client, no Spark, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from metastore.errors import (
    InternalError,
    NotAppliedTimeoutError,
    RequestTimeoutError,
    TxnIdReusedError,
    UnauthenticatedError,
    UnavailableError,
)
from spark_bridge import datasource
from spark_bridge.datasource import MetastoreWriter, WrittenFile
from tests.client.offline_writer import offline_writer
from tests.client.spark_task import write_file_of_rows, write_rows

SID = "0123456789abcdef0123456789abcdef"
COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}]
TS = 1 << 40


class ScriptedClient:
    """`commit` raises `commit_error`; `committed_txn` finds a record writing `tables` (None:
    no record)."""

    def __init__(self, commit_error: Exception, tables: list[str] | None) -> None:
        self.commit_error = commit_error
        self.tables = tables
        self.ops: list[str] = []

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        self.ops.append("session_close")
        return {"session_id": session_id, "closed": True}

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        self.ops.append(op)
        if op == "commit":
            raise self.commit_error
        assert op == "compaction_view"
        return {"loose_files_max": 0, "total_loose": 0, "total_deletes": 0}

    def committed_txn(self, txn_id: str, stream: str | None = None) -> dict[str, Any]:
        self.ops.append("committed_txn")
        if self.tables is None:
            return {"txn_id": txn_id, "txn": None}
        return {"txn_id": txn_id, "txn": {"txn_id": txn_id, "ts": TS, "tables": self.tables}}

    def close(self) -> None:
        pass


def _commit(
    monkeypatch: pytest.MonkeyPatch, client: ScriptedClient, *, txn_id: str | None = None
) -> MetastoreWriter:
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: client)
    writer = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location="/nowhere",
        columns=COLUMNS,
        overwrite=False,
        not_before=1,
        txn_id=txn_id,
        session_id=SID,
        session_ttl_ms=600_000,
    )
    writer.commit([WrittenFile(path=f"{writer.rel_dir}/p.parquet", size_bytes=1, row_count=1)])
    return writer


UNKNOWN = [UnavailableError("every node failed"), RequestTimeoutError("out of time")]


@pytest.mark.parametrize("error", UNKNOWN)
def test_a_commit_found_committed_after_an_unknown_outcome_succeeds(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """The job used to fail although its rows were committed; re-running it (a fresh txn id)
    then appended them twice."""
    client = ScriptedClient(error, ["ns.t"])
    _commit(monkeypatch, client)
    assert client.ops[:2] == ["commit", "committed_txn"]


@pytest.mark.parametrize("error", UNKNOWN)
def test_not_found_after_an_unknown_outcome_is_settled_by_closing_the_session(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """Not found is not "not committed": the commit may still be on its way to a leader. The
    job used to fail saying so, and an orchestrator re-running the failed job as it is (a
    fresh txn id) appended the rows twice once the first commit landed. The append's files
    lie in its session's attempt directory, and a commit applied after that session ended is
    refused (SESSION_NOT_FOUND): once the close is acknowledged the commit can no longer
    land, and a second lookup is the answer. Not found then, the job fails saying nothing was
    committed, and re-running it is safe."""
    client = ScriptedClient(error, None)
    with pytest.raises(type(error)) as raised:
        _commit(monkeypatch, client)
    assert client.ops[:4] == ["commit", "committed_txn", "session_close", "committed_txn"]
    assert raised.value.details["committed"] is False
    assert raised.value.details["outcome_unknown"] is False
    assert raised.value.details["txn_id"].startswith("append:ns.t:")
    assert "was not committed" in raised.value.message
    assert raised.value.retryable


class LandsBeforeTheCloseClient(ScriptedClient):
    """The commit was still on its way at the first lookup and landed before the close."""

    def committed_txn(self, txn_id: str, stream: str | None = None) -> dict[str, Any]:
        self.tables = ["ns.t"] if "session_close" in self.ops else None
        return super().committed_txn(txn_id)


@pytest.mark.parametrize("error", UNKNOWN)
def test_a_commit_that_lands_before_the_settling_close_succeeds(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    client = LandsBeforeTheCloseClient(error, None)
    _commit(monkeypatch, client)
    assert client.ops[:4] == ["commit", "committed_txn", "session_close", "committed_txn"]


@pytest.mark.parametrize("error", UNKNOWN)
def test_a_commit_adding_no_file_is_not_settled_by_the_close(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """No file of it lies in the session's directory (an overwrite of an empty DataFrame
    empties the table), so the close cannot stop it landing: it stays unknown."""
    client = ScriptedClient(error, None)
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: client)
    writer = MetastoreWriter(
        endpoints=["127.0.0.1:1"],
        token="t",
        table="ns.t",
        table_id=1,
        version=1,
        location="/nowhere",
        columns=COLUMNS,
        overwrite=True,
        not_before=1,
        session_id=SID,
        session_ttl_ms=600_000,
    )
    with pytest.raises(type(error)) as raised:
        writer.commit([])
    txn_id = raised.value.details["txn_id"]
    assert f".option('txn_id', {txn_id!r})" in raised.value.message
    assert client.ops[:2] == ["commit", "committed_txn"]
    assert client.ops[2:] == ["session_close"]  # only the commit's own, afterwards


class CloseFailsClient(ScriptedClient):
    def session_close(self, session_id: str) -> dict[str, Any]:
        self.ops.append("session_close")
        raise UnavailableError("no leader; its outcome is unknown")


@pytest.mark.parametrize("error", UNKNOWN)
def test_not_found_and_not_settled_names_the_txn_id_to_re_run_under(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """When the close cannot be confirmed either, the outcome stays unknown: the error names
    the txn id to re-run under (a txn id commits at most once)."""
    client = CloseFailsClient(error, None)
    with pytest.raises(type(error)) as raised:
        _commit(monkeypatch, client)
    txn_id = raised.value.details["txn_id"]
    assert txn_id.startswith("append:ns.t:")
    assert f".option('txn_id', {txn_id!r})" in raised.value.message
    assert client.ops[:3] == ["commit", "committed_txn", "session_close"]


REUSED = TxnIdReusedError("already committed with other writes", details={"committed_ts": TS})


@pytest.mark.parametrize("error", [REUSED, *UNKNOWN])
def test_a_txn_id_committed_by_a_write_of_another_table_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    client = ScriptedClient(error, ["ns.other"])
    with pytest.raises(TxnIdReusedError) as raised:
        _commit(monkeypatch, client, txn_id="nightly-load")
    assert raised.value.details["committed_tables"] == ["ns.other"]
    assert raised.value.details["table"] == "ns.t"
    assert "ns.other" in raised.value.message


def test_a_retried_job_whose_first_run_committed_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's txn id is looked up before committing (its mark refuses a commit of other
    tables only at or below its seq, metastore.client.txn_marks): found committed by this
    table, the job is done without sending the commit."""
    client = ScriptedClient(REUSED, ["ns.t"])
    _commit(monkeypatch, client, txn_id="nightly-load")
    assert client.ops[:1] == ["committed_txn"]
    assert "commit" not in client.ops


NESTED_COLUMNS = [
    {"field_id": 1, "name": "id", "type": "BIGINT", "nullable": False},
    {"field_id": 2, "name": "s", "type": "STRUCT<a: BIGINT, b: STRING>", "nullable": True},
    {"field_id": 5, "name": "tags", "type": "ARRAY<STRING>", "nullable": True},
    {"field_id": 6, "name": "m", "type": "MAP<STRING, ARRAY<INT>>", "nullable": True},
]


def _planned_writer(
    monkeypatch: pytest.MonkeyPatch, schema: Any, *, pinned_ts: int = TS, now: int = TS
) -> Any:
    """What `writer()` makes of a DataFrame `schema` for a table pinned with NESTED_COLUMNS at
    `pinned_ts`, the driver's clock reading `now` after the pin."""
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: ScriptedClient(REUSED, None))
    monkeypatch.setattr(datasource, "open_write_session", lambda *a, **k: (SID, 60_000))
    source = datasource.MetastoreDataSource({"table": "ns.t"})
    source._pinned = {  # type: ignore[attr-defined]
        "ts": pinned_ts,
        "now": now,
        "schema": {
            "table_id": 1,
            "version": 1,
            "location": "/nowhere",
            "schema": {"columns": NESTED_COLUMNS, "ddl": ""},
        },
    }
    return source.writer(schema, False)


def test_an_append_of_nested_values_spark_knows_are_not_null_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`F.struct(...)`, `F.array(F.lit(...))` and `F.create_map` of non-null values give
    nested fields Spark marks NOT NULL (containsNull=false, ...). Their values fit the pinned
    nullable fields; the writer refused them ("does not match") because it compared the
    nested nullability flags too."""
    from pyspark.sql import types as T

    strict = T.StructType(
        [
            T.StructField("ID", T.LongType(), False),
            T.StructField(
                "s",
                T.StructType(
                    [
                        T.StructField("a", T.LongType(), False),
                        T.StructField("b", T.StringType(), False),
                    ]
                ),
                False,
            ),
            T.StructField("tags", T.ArrayType(T.StringType(), False), False),
            T.StructField(
                "m",
                T.MapType(T.StringType(), T.ArrayType(T.IntegerType(), False), False),
                True,
            ),
        ]
    )
    writer = _planned_writer(monkeypatch, strict)
    assert writer.source_indexes == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "s_type",
    [
        # Spark casts a struct by position: other fields in another order would swap values.
        "STRUCT<b: STRING, a: BIGINT>",
        "STRUCT<a: BIGINT>",
        "STRUCT<a: BIGINT, b: BINARY>",  # no widening
    ],
)
def test_an_append_of_other_nested_fields_is_still_refused(
    monkeypatch: pytest.MonkeyPatch, s_type: str
) -> None:
    from pyspark.sql import types as T

    from spark_bridge.conform import spark_type

    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("s", spark_type(s_type), True),
            T.StructField("tags", T.ArrayType(T.StringType(), True), True),
            T.StructField("m", spark_type("MAP<STRING, ARRAY<INT>>"), True),
        ]
    )
    with pytest.raises(ValueError, match="does not match"):
        _planned_writer(monkeypatch, schema)


def test_nested_values_are_written_under_the_pinned_fields(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from pyspark.sql import Row

    from metastore.client.parquet import PinnedColumn, file_batches

    monkeypatch.setattr(datasource, "_client", lambda *a, **k: ScriptedClient(REUSED, None))
    writer = offline_writer(str(tmp_path), NESTED_COLUMNS, session_id=SID, session_ttl_ms=600_000)
    rows = [
        Row(ID=1, s=Row(a=7, b="x"), tags=["p", "q"], m={"k": [1, 2]}),
        Row(ID=2, s=None, tags=None, m=None),
    ]
    message = write_rows(writer, rows)
    columns = [PinnedColumn.from_wire(c) for c in NESTED_COLUMNS]
    read = [r for b in file_batches(f"{tmp_path}/{message.path}", columns) for r in b.to_pylist()]
    assert read == [
        {"id": 1, "s": {"a": 7, "b": "x"}, "tags": ["p", "q"], "m": [("k", [1, 2])]},
        {"id": 2, "s": None, "tags": None, "m": None},
    ]


def test_rows_are_conformed_by_the_bridge_s_rules(tmp_path: Any) -> None:
    """The rows of a DataFrame whose columns are the table's in another order and case, with
    narrower types (inside a struct, an array and a map too), one nullable column missing, are
    written as the bridge's conform writes them: by name, widened, the missing one NULL. The
    writer took them only in the table's order and types."""
    import datetime as dt
    from decimal import Decimal

    from pyspark.sql import Row
    from pyspark.sql import types as T

    from metastore.client.parquet import PinnedColumn, file_batches

    columns = [
        *NESTED_COLUMNS,
        {"field_id": 7, "name": "amount", "type": "DECIMAL(10,2)", "nullable": True},
        {"field_id": 8, "name": "day", "type": "TIMESTAMP_NTZ", "nullable": True},
        {"field_id": 9, "name": "ratio", "type": "DOUBLE", "nullable": True},
        {"field_id": 10, "name": "note", "type": "STRING", "nullable": True},
        {"field_id": 11, "name": "nothing", "type": "ARRAY<BIGINT>", "nullable": True},
    ]
    source = T.StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": {}}
                for n, t in [
                    (
                        "M",
                        {
                            "type": "map",
                            "keyType": "string",
                            "valueContainsNull": True,
                            "valueType": {
                                "type": "array",
                                "elementType": "short",
                                "containsNull": True,
                            },
                        },
                    ),
                    (
                        "S",
                        {
                            "type": "struct",
                            "fields": [
                                {"name": "A", "type": "integer", "nullable": True, "metadata": {}},
                                {"name": "b", "type": "string", "nullable": True, "metadata": {}},
                            ],
                        },
                    ),
                    ("day", "date"),
                    ("Id", "integer"),
                    ("amount", "decimal(5,2)"),
                    ("ratio", "float"),
                    ("nothing", "void"),
                    ("tags", {"type": "array", "elementType": "string", "containsNull": True}),
                ]
            ],
        }
    )
    writer = offline_writer(str(tmp_path), columns, source_schema=source)
    assert writer.source_indexes == [3, 1, 7, 0, 4, 2, 5, None, 6]
    rows = [
        Row(
            M={"k": [1, None]},
            S=Row(A=7, b="x"),
            day=dt.date(2026, 1, 2),
            Id=1,
            amount=Decimal("1.25"),
            ratio=0.5,
            nothing=None,
            tags=["p"],
        ),
        Row(M=None, S=None, day=None, Id=2, amount=None, ratio=None, nothing=None, tags=None),
        Row(
            M={},
            S=Row(A=None, b=None),
            day=None,
            Id=3,
            amount=None,
            ratio=None,
            nothing=None,
            tags=[None],
        ),
    ]
    message = write_file_of_rows(writer, rows)
    pinned = [PinnedColumn.from_wire(c) for c in columns]
    read = [r for b in file_batches(f"{tmp_path}/{message.path}", pinned) for r in b.to_pylist()]
    nothing = {"note": None, "nothing": None}
    assert read == [
        {
            "id": 1,
            "s": {"a": 7, "b": "x"},
            "tags": ["p"],
            "m": [("k", [1, None])],
            "amount": Decimal("1.25"),
            "day": dt.datetime(2026, 1, 2),
            "ratio": 0.5,
            **nothing,
        },
        {
            "id": 2,
            "s": None,
            "tags": None,
            "m": None,
            "amount": None,
            "day": None,
            "ratio": None,
            **nothing,
        },
        {
            "id": 3,
            "s": {"a": None, "b": None},
            "tags": [None],
            "m": [],
            "amount": None,
            "day": None,
            "ratio": None,
            **nothing,
        },
    ]


def test_the_commit_floor_is_above_the_pinned_timestamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default pin is at the leader's `read_ts` when that is above the driver's clock (a
    commit may land up to DD past its entry's Tm). The commit's floor was the clock + 1, so it
    could land below the pin: a version the pin found there (Tu in between) is not active at
    the commit's ts, which was refused (SCHEMA_VERSION_NOT_ACTIVE) after the whole job ran."""
    from spark_bridge.conform import pinned_struct

    schema = pinned_struct(NESTED_COLUMNS)
    ahead = _planned_writer(monkeypatch, schema, pinned_ts=TS + 1000, now=TS)
    assert ahead.not_before == TS + 1001
    behind = _planned_writer(monkeypatch, schema, pinned_ts=TS - 1000, now=TS)
    assert behind.not_before == TS + 1  # a pin below the clock: above now, as before


class LookupFailsClient(ScriptedClient):
    """The commit's outcome is unknown and its lookup fails too."""

    def __init__(self, commit_error: Exception, lookup_error: Exception) -> None:
        super().__init__(commit_error, None)
        self.lookup_error = lookup_error

    def committed_txn(self, txn_id: str, stream: str | None = None) -> dict[str, Any]:
        self.ops.append("committed_txn")
        raise self.lookup_error


@pytest.mark.parametrize("error", UNKNOWN)
@pytest.mark.parametrize(
    "lookup_error",
    [
        UnavailableError("no leader"),
        InternalError("KeyError: 'x'"),
        UnauthenticatedError("the token is not valid here (rotated?)"),
    ],
)
def test_a_failed_lookup_after_an_unknown_outcome_still_names_the_txn_id(
    monkeypatch: pytest.MonkeyPatch, error: Exception, lookup_error: Exception
) -> None:
    """Whatever made the lookup fail, the commit's outcome is still unknown: the job must fail
    with the error that names the txn id to re-run under. A lookup failing otherwise than
    UNAVAILABLE or TIMEOUT (a bug on the node, a token rotated meanwhile) was raised as is,
    and the job re-run without the id appended its rows twice if the commit had landed."""
    client = LookupFailsClient(error, lookup_error)
    with pytest.raises(type(error)) as raised:
        _commit(monkeypatch, client)
    txn_id = raised.value.details["txn_id"]
    assert f".option('txn_id', {txn_id!r})" in raised.value.message
    assert client.ops[:4] == ["commit", "committed_txn", "session_close", "committed_txn"]


def test_an_append_s_columns_are_matched_to_the_pinned_as_spark_matches_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer takes a DataFrame column for a pinned one as Spark's analyzer would (Java's
    equalsIgnoreCase): `Straße` is the pinned `straße`, while `strasse` is not (it is the
    sibling `STRASSE`); casefold took `strasse` for `straße` and wrote it there."""
    from pyspark.sql import types as T

    siblings = [
        {"field_id": 1, "name": "straße", "type": "STRING", "nullable": True},
        {"field_id": 2, "name": "STRASSE", "type": "STRING", "nullable": True},
    ]
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: ScriptedClient(REUSED, None))
    monkeypatch.setattr(datasource, "open_write_session", lambda *a, **k: (SID, 60_000))
    source = datasource.MetastoreDataSource({"table": "ns.t"})
    source._pinned = {  # type: ignore[attr-defined]
        "ts": TS,
        "now": TS,
        "schema": {
            "table_id": 1,
            "version": 1,
            "location": "/nowhere",
            "schema": {"columns": siblings, "ddl": ""},
        },
    }

    def schema(*names: str) -> Any:
        return T.StructType([T.StructField(n, T.StringType()) for n in names])

    assert source.writer(schema("Straße", "strasse"), False) is not None
    with pytest.raises(ValueError, match="does not match"):
        source.writer(schema("strasse", "STRASSE"), False)


_FITTING = [
    ("id", "BIGINT"),
    ("s", "STRUCT<a: BIGINT, b: STRING>"),
    ("tags", "ARRAY<STRING>"),
    ("m", "MAP<STRING, ARRAY<INT>>"),
]


@pytest.mark.parametrize(
    ("columns", "names_in_message"),
    [
        # An extra column, the NOT NULL one missing, a type that does not widen, struct fields
        # in another order, a column twice: each named, in the bridge's conform's words.
        ([*_FITTING, ("extra", "STRING")], ["'extra'"]),
        (_FITTING[1:], ["'id'", "lacks NOT NULL column"]),
        ([("id", "STRING"), *_FITTING[1:]], ["'id'", "string", "bigint"]),
        (
            [_FITTING[0], ("s", "STRUCT<b: STRING, a: BIGINT>"), *_FITTING[2:]],
            ["'s'", "by position"],
        ),
        ([*_FITTING[:3], ("ID", "BIGINT")], ["'id'", "more than once"]),
    ],
)
def test_an_append_that_does_not_fit_is_a_typed_error_naming_the_column(
    monkeypatch: pytest.MonkeyPatch, columns: list[tuple[str, str]], names_in_message: list[str]
) -> None:
    """A format("metastore") append whose DataFrame does not fit the table failed with a bare
    ValueError printing both schemas, naming neither the column at fault nor what differs
    (the batch API's conform names them). Now SchemaMismatchError (code SCHEMA_MISMATCH, as
    the batch API raises) names the column and the difference, in conform's own words."""
    from pyspark.sql import types as T

    from spark_bridge.conform import SchemaMismatchError, spark_type

    schema = T.StructType([T.StructField(n, spark_type(t), True) for n, t in columns])
    with pytest.raises(SchemaMismatchError, match=r"does not match ns\.t") as info:
        _planned_writer(monkeypatch, schema)
    for name in names_in_message:
        assert name in str(info.value), (name, str(info.value))


NOT_APPLIED = [
    NotAppliedTimeoutError(
        "commit did not complete within 10000 ms; it was not applied",
        details={"not_applied": True, "sent": False},
    ),
    UnavailableError("no leader known right now; retry shortly", details={"not_applied": True}),
]


@pytest.mark.parametrize("error", NOT_APPLIED)
def test_a_commit_the_client_says_was_not_applied_is_neither_looked_up_nor_settled(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """The client's verdict that no node ran the commit (NotAppliedTimeoutError, or every
    node answered "nothing done") was taken for an unknown outcome: the append looked it up
    and closed its session to settle it, on a cluster that had just failed it, and ended
    "outcome unknown" when those failed too."""
    client = ScriptedClient(error, None)
    with pytest.raises(type(error)) as raised:
        _commit(monkeypatch, client)
    assert client.ops[0] == "commit"
    assert "committed_txn" not in client.ops, client.ops
    assert raised.value.details["outcome_unknown"] is False
    assert raised.value.details["not_applied"] is True
    txn_id = raised.value.details["txn_id"]
    assert "was not applied and never will be" in raised.value.message
    assert f".option('txn_id', {txn_id!r})" in raised.value.message
