"""What one DDL statement may cost the node that parses it (metastore/ddl.py,
metastore/default_values.py, metastore/sqlglot_types.py). A writer's CREATE TABLE within
MAX_STATEMENT_BYTES whose DEFAULTs held thousands of literals (`1Y + 1Y + ...`) took about
100 s of a node's CPU: the session-time-zone check rendered every sub-expression of a DEFAULT
(time quadratic in its size), every DEFAULT was parsed and rendered again by each of two
rendering checks, and sqlglot ran its whole parser over a type name for each cast it read or
rendered. The work is now linear in the statement, done once per distinct DEFAULT, and the
tokens of the DEFAULTs of one statement are bounded (MAX_DEFAULT_TOKENS_PER_STATEMENT)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlglot import exp

from metastore import limits
from metastore.commands import CreateTable
from metastore.ddl import parse_ddl
from metastore.errors import ErrorCode, MetastoreError
from metastore.lexer import tokenize


def _sum_of(literals: int, *, first: int = 1) -> str:
    return " + ".join(f"{(first + i) % 100}Y" for i in range(literals))


def _create(defaults: list[str]) -> str:
    columns = ", ".join(f"c{i} INT DEFAULT {d}" for i, d in enumerate(defaults))
    return f"CREATE TABLE ns.t ({columns})"


def _default_tokens(defaults: list[str]) -> int:
    return sum(len(tokenize(d)) - 1 for d in defaults)  # the lexer's last token is EOF


def test_the_checks_of_a_default_render_it_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rendering every sub-expression of a DEFAULT of n literals renders O(n^2) characters.
    rendered_chars = 0
    render = exp.Expression.sql

    def counting_render(self: exp.Expression, *args: Any, **kwargs: Any) -> str:
        nonlocal rendered_chars
        text = render(self, *args, **kwargs)
        rendered_chars += len(text)
        return text

    monkeypatch.setattr(exp.Expression, "sql", counting_render)
    cmd = parse_ddl(_create([_sum_of(40)]))
    assert isinstance(cmd, CreateTable)
    stored = cmd.schema.columns[0].default_sql
    assert stored is not None and stored.count("CAST(") == 40
    assert rendered_chars <= 8 * len(stored)


def test_a_default_repeated_on_every_column_is_checked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import metastore.ddl as ddl

    checked: list[str | None] = []
    check = ddl.check_default

    def counting_check(column: Any, **kwargs: Any) -> None:
        checked.append(column.default_sql)
        check(column, **kwargs)

    monkeypatch.setattr(ddl, "check_default", counting_check)
    cmd = parse_ddl(_create(["CAST(0 AS DECIMAL(10,2))"] * 50))
    assert isinstance(cmd, CreateTable)
    assert {c.default_sql for c in cmd.schema.columns} == {"CAST(0 AS DECIMAL(10, 2))"}
    assert len(checked) == 1


@pytest.mark.parametrize(
    ("limit", "distinct"),
    [
        ("MAX_DEFAULT_TOKENS_PER_STATEMENT", False),
        ("MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT", True),
    ],
)
def test_a_statement_whose_defaults_hold_too_many_tokens_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch, limit: str, distinct: bool
) -> None:
    import metastore.ddl as ddl

    per_default = _default_tokens([_sum_of(40)])
    count = getattr(limits, limit) // per_default + 1
    defaults = [_sum_of(40, first=i if distinct else 1) for i in range(count)]
    sql = _create(defaults)
    assert len(sql.encode()) <= limits.MAX_STATEMENT_BYTES
    monkeypatch.setattr(ddl, "_sqlglot_parse", lambda _sql: pytest.fail("parsed"))
    with pytest.raises(MetastoreError) as refused:
        parse_ddl(sql)
    assert refused.value.code is ErrorCode.LIMIT_EXCEEDED
    assert refused.value.details["limit"] == limit
    assert refused.value.details["value"] == per_default * count


@pytest.mark.parametrize(
    "statement", ["default_0", "decimal_cast", "realistic_mix", "costliest_allowed"]
)
def test_the_widest_statements_the_limits_allow_are_accepted(statement: str) -> None:
    # `make bench-ddl`'s statements (one builder for both): 1,000 columns of the DEFAULTs
    # tables have, and the most sqlglot work a statement may ask for (distinct sums of typed
    # literals up to the distinct-token limit, one repeated up to the all-token limit). What
    # they cost is the benchmark's business; here, that the limits let them through.
    from bench.bench_ddl_parse import STATEMENTS

    sql = STATEMENTS[statement]()
    assert len(sql.encode()) <= limits.MAX_STATEMENT_BYTES
    cmd = parse_ddl(sql)
    assert isinstance(cmd, CreateTable)
    assert len(cmd.schema.columns) == sql.count(" DEFAULT ") > 0


def test_a_wide_table_repeating_one_long_default_stays_valid() -> None:
    columns = [
        f"c{i} DECIMAL(10,2) DEFAULT CAST(0 AS DECIMAL(10,2))"
        for i in range(limits.MAX_COLUMNS_PER_TABLE)
    ]
    cmd = parse_ddl(f"CREATE TABLE ns.t ({', '.join(columns)})")
    assert isinstance(cmd, CreateTable) and len(cmd.schema.columns) == 1000


def test_memoized_type_names_are_handed_out_as_copies() -> None:
    import metastore.ddl  # noqa: F401  (installs the memo)

    first = exp.DataType.build("decimal(10, 2)", dialect="spark")
    second = exp.DataType.build("decimal(10, 2)", dialect="spark")
    assert first == second and first is not second
    first.set("this", exp.DataType.Type.TEXT)  # sqlglot's generators modify what they get
    assert exp.DataType.build("decimal(10, 2)", dialect="spark") == second
    assert second.sql(dialect="spark") == "DECIMAL(10, 2)"
