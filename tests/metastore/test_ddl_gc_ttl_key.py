"""The GC TTL property is one key whatever its case (found by an adversarial review of the DDL).

GC reads the TTL from any key that is `gc.ttl` case-insensitively (`commands.gc_ttl_ms_of`), but
properties are stored case-sensitively: a table created with 'GC.TTL' = '1s' and then set to
'gc.ttl' = '30d' held both, and GC used the first in sorted order, '1s'. The DDL now writes every
spelling of the key as `gc.ttl`, so a later SET replaces the earlier one.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from metastore import limits
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    AdvanceGcThreshold,
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
from tests.metastore._driver import MS, Driver

DAY_MS = 86_400_000
T = TableName.of("ns", "t")


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


# --- A key another spelling was stored under before the fix (found by the GC review) ----------
# The parser only writes `gc.ttl` since the fix; a table created before it (its log entry, its
# snapshot) still holds 'GC.TTL'. SET and UNSET of `gc.ttl` then left that key in place: the
# user set 30 days and GC kept using the old second, and UNSET said the key was not set.


def _table_with_an_old_spelling(apply_version: int) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    created = parse_ddl("CREATE TABLE ns.t (a INT)")
    assert isinstance(created, CreateTable)
    # As an older release's parser wrote it (and a protocol client may still send it).
    d.apply(replace(created, properties=(("GC.TTL", "1s"),))).raise_for_error()
    return d


def _threshold_held_by(d: Driver) -> dict[str, object]:
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    d.tm += 60_000 * MS
    outcome = d.apply(AdvanceGcThreshold(table=T, table_id=table_id, up_to=1 << 62))
    outcome.raise_for_error()
    held_by = outcome.result["held_by"]
    assert isinstance(held_by, dict)
    return held_by


def test_setting_the_ttl_replaces_a_spelling_stored_before_the_fix() -> None:
    d = _table_with_an_old_spelling(APPLY_VERSION_SUPPORTED)
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('gc.ttl' = '30d')")
    assert d.state.catalog.current(T).properties == (("gc.ttl", "30d"),)
    assert _threshold_held_by(d) == {"kind": "ttl", "ttl_ms": 30 * DAY_MS}


def test_unsetting_the_ttl_removes_a_spelling_stored_before_the_fix() -> None:
    d = _table_with_an_old_spelling(APPLY_VERSION_SUPPORTED)
    d.ok("ALTER TABLE ns.t UNSET TBLPROPERTIES ('gc.ttl')")
    assert d.state.catalog.current(T).properties == ()
    assert _threshold_held_by(d) == {"kind": "ttl", "ttl_ms": limits.GC_TTL_MS_DEFAULT}


def test_below_apply_version_5_set_and_unset_keep_the_old_rule() -> None:
    d = _table_with_an_old_spelling(4)
    d.ok("ALTER TABLE ns.t SET TBLPROPERTIES ('gc.ttl' = '30d')")
    assert d.state.catalog.current(T).properties == (("GC.TTL", "1s"), ("gc.ttl", "30d"))
    assert _threshold_held_by(d) == {"kind": "ttl", "ttl_ms": 1_000}
    d.ok("ALTER TABLE ns.t UNSET TBLPROPERTIES ('gc.ttl')")
    assert d.state.catalog.current(T).properties == (("GC.TTL", "1s"),)
