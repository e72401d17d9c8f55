"""The GC TTL property is one key whatever its case (found by an adversarial review of the DDL).

GC reads the TTL from any key that is `gc.ttl` case-insensitively (`commands.gc_ttl_ms_of`), but
properties are stored case-sensitively: a table created with 'GC.TTL' = '1s' and then set to
'gc.ttl' = '30d' held both, and GC used the first in sorted order, '1s'. The DDL now writes every
spelling of the key as `gc.ttl`, so a later SET replaces the earlier one.
"""

from __future__ import annotations

import pytest

from metastore.commands import (
    AlterTable,
    CreateNamespace,
    CreateTable,
    SetTableProperties,
    TableName,
    UnsetTableProperties,
    gc_ttl_ms_of,
)
from metastore.ddl import parse_ddl
from metastore.errors import InvalidArgumentError
from tests.metastore._driver import Driver

DAY_MS = 86_400_000


def test_setting_the_ttl_in_another_case_replaces_it() -> None:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('GC.TTL' = '1s')")
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('gc.ttl' = '30d')")
    properties = d.state.catalog.current(TableName.of("ns", "t")).properties
    assert gc_ttl_ms_of(properties) == 30 * DAY_MS
    assert properties == (("gc.ttl", "30d"),)
    d.ok("ALTER TABLE ns.t UNSET TBLPROPERTIES ('Gc.Ttl')")
    assert d.state.catalog.current(TableName.of("ns", "t")).properties == ()


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE ns.t SET TBLPROPERTIES ('GC.TTL' = '1h')",
        "ALTER TABLE ns.t SET TBLPROPERTIES (GC.Ttl = '1h')",
    ],
)
def test_set_writes_the_canonical_key(sql: str) -> None:
    cmd = parse_ddl(sql)
    assert isinstance(cmd, AlterTable)
    assert cmd.changes == (SetTableProperties(properties=(("gc.ttl", "1h"),)),)


def test_create_and_unset_write_the_canonical_key() -> None:
    table = parse_ddl("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('GC.ttl' = '1h', 'Other' = 'x')")
    assert isinstance(table, CreateTable)
    assert table.properties == (("Other", "x"), ("gc.ttl", "1h"))
    namespace = parse_ddl("CREATE NAMESPACE ns WITH DBPROPERTIES ('GC.TTL' = '2h')")
    assert isinstance(namespace, CreateNamespace)
    assert namespace.properties == (("gc.ttl", "2h"),)
    unset = parse_ddl("ALTER TABLE ns.t UNSET TBLPROPERTIES IF EXISTS ('GC.TTL', 'Other')")
    assert isinstance(unset, AlterTable)
    assert unset.changes == (UnsetTableProperties(keys=("gc.ttl", "Other"), if_exists=True),)


def test_two_spellings_of_the_ttl_in_one_clause_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="duplicate"):
        parse_ddl("CREATE TABLE ns.t (a INT) TBLPROPERTIES ('GC.TTL' = '1s', 'gc.ttl' = '30d')")
