"""ALTER TABLE finds the columns it names with Java's equalsIgnoreCase exactly (apply version 6).

Apply version 5 matched names with Python's case tables (`schema.spark_name_key`), which are
the *full* case mappings: `'İ'.lower()` is `i` plus a combining dot, so `DROP COLUMN İD` found
no column `id`, where Spark (Java's simple mappings: `Character.toLowerCase('İ') == 'i'`) drops
it. Version 6 uses Java 17's own table (`metastore.java_case`), and refuses a name that matches
two siblings (`ıd` and `id` both match `ID`), as Spark does (AMBIGUOUS_REFERENCE), unless one
of them is named exactly so, instead of taking the first. Below version 6 the version 5 rule
stays, so a log applies alike on every release during an upgrade.
"""

# The letters that look alike (dotless i, long s, Cherokee, Greek) are what this file tests.
# ruff: noqa: RUF001, RUF002

from __future__ import annotations

import pytest

from metastore.commands import TableName
from metastore.errors import ColumnAlreadyExistsError, ColumnNotFoundError, InvalidArgumentError
from metastore.java_case import _KEY_OF, java_case_key
from tests.metastore._driver import Driver

T = TableName.of("ns", "t")

# (a, b, a.equalsIgnoreCase(b)) as measured with OpenJDK 17.0.15.
MEASURED_ON_JAVA_17 = [
    ("İ", "i", True),
    ("İ", "I", True),
    ("ı", "i", True),
    ("ı", "I", True),
    ("İ", "ı", True),
    ("id", "İD", True),
    ("ſ", "s", True),
    ("ſ", "S", True),
    ("\u212a", "k", True),  # the Kelvin sign
    ("\u212a", "K", True),
    ("ß", "ẞ", True),
    ("ß", "ss", False),
    ("ẞ", "SS", False),
    ("ᾀ", "ᾈ", True),
    ("ᾳ", "ᾼ", True),
    ("ﬁ", "fi", False),
    ("µ", "μ", True),  # the micro sign and Greek mu
    ("µ", "Μ", True),
    ("ÿ", "Ÿ", True),
    ("ς", "Σ", True),
    ("ǅ", "ǆ", True),
    ("Ω", "\u2126", True),  # the Ohm sign
    ("\u1e9b", "\u1e60", True),
    ("Ꭰ", "ꭰ", True),
    ("ა", "Ა", True),
    ("ǰ", "J", False),
    ("\U00010400", "\U00010428", True),  # Deseret: a surrogate pair in Java, one code point
    ("\u2c2f", "\u2c5f", False),  # a case pair from Unicode 14: not in Java 17's tables
    ("\ua7c0", "\ua7c1", False),
    ("\U00010570", "\U00010597", False),
]


@pytest.mark.parametrize(("a", "b", "equal"), MEASURED_ON_JAVA_17)
def test_the_key_is_javas_equals_ignore_case_as_measured(a: str, b: str, equal: bool) -> None:
    assert (java_case_key(a) == java_case_key(b)) is equal


def test_keys_never_cross_between_planes() -> None:
    """Java compares UTF-16 units of strings of equal UTF-16 length (a pair as one code point):
    equal keys must imply equal lengths, so no key of a BMP character is supplementary or the
    other way round."""
    for code_point in range(0x110000):
        if 0xD800 <= code_point <= 0xDFFF:
            continue
        key = ord(java_case_key(chr(code_point)))
        assert (key > 0xFFFF) == (code_point > 0xFFFF), hex(code_point)


def test_the_ascii_shortcut_gives_the_tables_key() -> None:
    """An ASCII name's key is `str.lower` (a shortcut for speed): the same as the table's,
    character by character, and equal to the key of the non-ASCII letters Java pairs with
    ASCII ones (dotted and dotless I, long s, Kelvin sign)."""
    for code_point in range(128):
        c = chr(code_point)
        assert java_case_key(c) == chr(_KEY_OF.get(code_point, code_point))
    assert java_case_key("Name_9$") == "name_9$"
    for ascii_name, other in (("ID", "İd"), ("ID", "ıd"), ("S", "ſ"), ("K", "\u212a")):
        assert java_case_key(ascii_name) == java_case_key(other)


def test_the_widest_alter_finds_a_clash_with_any_sibling() -> None:
    """ADD COLUMNS compares each new name with every sibling (in C among ASCII names, with
    the table otherwise)."""
    added = ", ".join(f"c{i} INT" for i in range(997))
    for existing, clash in (("a", "A"), ("`İ`", "i"), ("i", "`İ`")):
        d = _table(7, f"{existing} INT")
        refused = d.sql(f"ALTER TABLE ns.t ADD COLUMNS ({added}, {clash} INT)").exception()
        assert isinstance(refused, ColumnAlreadyExistsError), refused
    d = _table(7, "a INT")
    d.ok(f"ALTER TABLE ns.t ADD COLUMNS ({added}, `ß` INT, SS INT)")
    assert len(_names(d)) == 1000


def _table(apply_version: int, columns: str) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.t ({columns})")
    return d


def _names(d: Driver) -> list[str]:
    return [c.name for c in d.state.catalog.current(T).schema.columns]


RESOLVED_ONLY_BY_JAVA = [
    "ALTER TABLE ns.t DROP COLUMN `İD`",
    "ALTER TABLE ns.t RENAME COLUMN `İD` TO n",
    "ALTER TABLE ns.t ALTER COLUMN `İD` TYPE BIGINT",
    "ALTER TABLE ns.t ALTER COLUMN `İD` COMMENT 'c'",
    "ALTER TABLE ns.t ALTER COLUMN `İD` FIRST",
    "ALTER TABLE ns.t ADD COLUMN n INT AFTER `İD`",
    "ALTER TABLE ns.t ADD COLUMN `İNFO`.y INT",
    "ALTER TABLE ns.t DROP COLUMN info.`İ`",
]


@pytest.mark.parametrize("sql", RESOLVED_ONLY_BY_JAVA)
def test_version_6_finds_a_column_as_java_does(sql: str) -> None:
    d = _table(6, "a INT, id INT, info STRUCT<i: INT, z: INT>")
    d.ok(sql)


@pytest.mark.parametrize("sql", RESOLVED_ONLY_BY_JAVA)
def test_below_version_6_the_version_5_rule_stays(sql: str) -> None:
    d = _table(5, "a INT, id INT, info STRUCT<i: INT, z: INT>")
    before = d.state.to_snapshot()
    outcome = d.sql(sql)
    assert isinstance(outcome.exception(), ColumnNotFoundError), outcome
    assert d.state.to_snapshot() == before


def test_version_6_drops_the_column_java_names() -> None:
    d = _table(6, "a INT, id INT")
    d.ok("ALTER TABLE ns.t DROP COLUMN `İD`")
    assert _names(d) == ["a"]


def test_an_add_column_job_goes_public_after_the_sibling_java_resolved() -> None:
    d = _table(6, "a INT, id INT, z INT")
    d.ok("ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1 AFTER `İD`")
    d.finish_jobs()
    assert _names(d) == ["a", "id", "n", "z"]


AMBIGUOUS = [
    "ALTER TABLE ns.t DROP COLUMN ID",
    "ALTER TABLE ns.t RENAME COLUMN ID TO n",
    "ALTER TABLE ns.t ALTER COLUMN ID TYPE BIGINT",
    "ALTER TABLE ns.t ALTER COLUMN a AFTER ID",
    "ALTER TABLE ns.t ADD COLUMN n INT AFTER ID",
    "ALTER TABLE ns.t ADD COLUMN n INT NOT NULL DEFAULT 1 AFTER ID",  # a schema change job
    "ALTER TABLE ns.t DROP COLUMN s.I",
    "ALTER TABLE ns.t ADD COLUMN `IS`.y INT",
]


@pytest.mark.parametrize("sql", AMBIGUOUS)
def test_version_6_refuses_a_name_that_matches_two_siblings(sql: str) -> None:
    """`ıd` and `id` are distinct names to the catalog (uniqueness folds by casefold, and
    Spark's own duplicate check lowercases with the root locale) but both are `ID` to Java's
    equalsIgnoreCase: Spark refuses such a reference as ambiguous, and so does version 6
    unless one of them is named exactly so."""
    d = _table(
        6, "a INT, `ıd` INT, id INT, s STRUCT<`ı`: INT, i: INT>, `ıs` STRUCT<x: INT>, `is` INT"
    )
    before = d.state.to_snapshot()
    outcome = d.sql(sql)
    error = outcome.exception()
    assert isinstance(error, InvalidArgumentError), outcome
    assert error.details["reason"] == "ambiguous_column"
    assert d.state.to_snapshot() == before


@pytest.mark.parametrize(("named", "left"), [("id", "ıd"), ("ıd", "id")])
def test_version_6_takes_the_sibling_named_exactly(named: str, left: str) -> None:
    """Spark with caseSensitive would, and it keeps each of the two reachable."""
    d = _table(6, "a INT, `ıd` INT, id INT")
    d.ok(f"ALTER TABLE ns.t DROP COLUMN `{named}`")
    assert _names(d) == ["a", left]


def test_below_version_6_an_ambiguous_name_takes_the_first_match() -> None:
    """Even when another sibling is named exactly so: `DROP COLUMN id` dropped `ıd`."""
    d = _table(5, "a INT, `ıd` INT, id INT")
    d.ok("ALTER TABLE ns.t DROP COLUMN id")
    assert _names(d) == ["a", "id"]
