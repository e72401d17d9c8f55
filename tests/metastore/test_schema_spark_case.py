"""ALTER TABLE finds the columns it names as Spark does (apply version 5).

Found by an adversarial review of schema evolution: names were matched by Python's casefold,
which folds `ß` to `ss` and the ligature `ﬁ` to `fi`, so `DROP COLUMN strasse` dropped `straße`
and `ALTER COLUMN file TYPE BIGINT` widened `ﬁle`. Spark resolves names with Java's
equalsIgnoreCase and finds no such column (measured with pyspark 4: UNRESOLVED_COLUMN), so
that bad input must be refused and change nothing. Below version 5 the old rule stays, so a
log applies alike on every release during an upgrade.
"""

from __future__ import annotations

import pytest

from metastore.commands import TableName
from metastore.errors import ColumnAlreadyExistsError, ColumnNotFoundError, MetastoreError
from metastore.schema import Column, Schema, spark_name_key
from metastore.types import INT
from tests.metastore._driver import Driver

T = TableName.of("ns", "t")

MISNAMED = [
    "ALTER TABLE ns.t DROP COLUMN strasse",
    "ALTER TABLE ns.t RENAME COLUMN STRASSE TO x",
    "ALTER TABLE ns.t ALTER COLUMN file TYPE BIGINT",
    "ALTER TABLE ns.t ALTER COLUMN file COMMENT 'c'",
    "ALTER TABLE ns.t ALTER COLUMN strasse DROP NOT NULL",
    "ALTER TABLE ns.t ALTER COLUMN a AFTER strasse",
    "ALTER TABLE ns.t ADD COLUMN n INT AFTER file",
    "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1 AFTER strasse",  # a schema change job
    "ALTER TABLE ns.t ADD COLUMN ss.y INT",  # the struct `ß`
    "ALTER TABLE ns.t DROP COLUMN ss.x",
]


def _table(apply_version: int) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok(
        "CREATE TABLE ns.t (a INT, `straße` STRING NOT NULL, `ﬁle` INT, `ß` STRUCT<x: INT, z: INT>)"
    )
    return d


@pytest.mark.parametrize("sql", MISNAMED)
def test_a_name_spark_does_not_resolve_is_refused_and_changes_nothing(sql: str) -> None:
    d = _table(apply_version=5)
    before = d.state.to_snapshot()
    outcome = d.sql(sql)
    assert isinstance(outcome.exception(), ColumnNotFoundError), outcome
    assert d.state.to_snapshot() == before


@pytest.mark.parametrize("sql", MISNAMED)
def test_below_version_5_names_are_matched_by_casefold_as_before(sql: str) -> None:
    d = _table(apply_version=4)
    d.ok(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t RENAME COLUMN `STRAẞE` TO x",  # the capital sharp s: Spark finds it
        "ALTER TABLE ns.t ALTER COLUMN `ﬁLE` TYPE BIGINT",
        "ALTER TABLE ns.t ALTER COLUMN `ß`.X TYPE BIGINT",
        "ALTER TABLE ns.t ADD COLUMN `ẞ`.y INT",
        "ALTER TABLE ns.t DROP COLUMN A",
    ],
)
def test_names_spark_resolves_case_insensitively_still_match(sql: str) -> None:
    d = _table(apply_version=5)
    d.ok(sql)


def test_uniqueness_still_folds_fully() -> None:
    """Spark would allow `ss` beside `ß`; the catalog keeps refusing it (stricter is safe)."""
    d = _table(apply_version=5)
    outcome = d.sql("ALTER TABLE ns.t ADD COLUMN ss INT")
    assert isinstance(outcome.exception(), ColumnAlreadyExistsError)


def test_the_key_is_javas_equals_ignore_case() -> None:
    assert spark_name_key("straße") != spark_name_key("strasse")
    assert spark_name_key("STRAẞE") == spark_name_key("straße")
    assert spark_name_key("ﬁle") != spark_name_key("file")
    assert spark_name_key("Ǆ") == spark_name_key("ǆ") == spark_name_key("ǅ")
    assert spark_name_key("\u212a") == spark_name_key("k")  # the Kelvin sign
    assert spark_name_key("\u03c2") == spark_name_key("\u03a3") == spark_name_key("\u03c3")


def test_lookup_default_is_unchanged() -> None:
    schema = Schema(columns=(Column(field_id=1, name="straße", type=INT),))
    assert schema.lookup(("STRASSE",)).name == "straße"
    with pytest.raises(MetastoreError):
        schema.lookup(("STRASSE",), spark_case=True)


def test_an_add_column_job_goes_public_after_the_sibling_spark_resolved() -> None:
    d = _table(apply_version=5)
    d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1 AFTER `STRAẞE`")
    d.finish_jobs()
    names = [c.name for c in d.state.catalog.current(T).schema.columns]
    assert names == ["a", "straße", "n", "ﬁle", "ß"]
