"""The path check of `allowed_locations` (metastore/daemon/allowed_locations.py): a table's
location must lie inside the warehouse or a configured root, judged so that no spelling of a
path outside gets in (prefixes, symbolic links, `file://`, scheme case, percent-encoding)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metastore.daemon.allowed_locations import (
    REASON_NOT_ALLOWED,
    REASON_SHARES_DIRECTORY,
    AllowedLocations,
    RealPaths,
    check_no_shared_directory,
)
from metastore.daemon.gc_worker import _delete_files
from metastore.errors import InvalidArgumentError


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, AllowedLocations]:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    allowed = AllowedLocations.of(warehouse=str(warehouse), extra=["s3a://Bucket/ext/"])
    return tmp_path, allowed


def test_locations_inside_the_warehouse_or_a_root_are_allowed(
    layout: tuple[Path, AllowedLocations],
) -> None:
    tmp, allowed = layout
    for location in (
        f"{tmp}/warehouse",
        f"{tmp}/warehouse/ns.db/t",
        f"{tmp}/warehouse/ns.db/t/",
        f"file://{tmp}/warehouse/ns.db/t",
        f"FILE://{tmp}/warehouse/t",
        "s3a://bucket/ext/t",
        "s3://bucket/ext/t",  # the same store as s3a (pyarrow's name, which the GC uses)
        "S3A://BUCKET/ext/t",
        "s3a://bucket/ext/t%20x",
    ):
        assert allowed.allows(location), location
        allowed.check_new_location(location)


@pytest.mark.parametrize(
    "suffix",
    [
        "/warehouse-evil/t",  # a prefix of the text, not of the segments
        "/other/t",
        "/warehouse/../other",  # as the kernel resolves it (DDL refuses '..' anyway)
    ],
)
def test_local_locations_outside_are_refused(
    layout: tuple[Path, AllowedLocations], suffix: str
) -> None:
    tmp, allowed = layout
    for location in (f"{tmp}{suffix}", f"file://{tmp}{suffix}"):
        assert not allowed.allows(location), location


@pytest.mark.parametrize(
    "location",
    [
        "/",
        "/home/someone/important",
        "relative/path",
        "file://host/warehouse",  # a host: not a local path a prefix check can judge
        "s3a://bucket/ext-evil/t",
        "s3a://bucket/extra",
        "s3a://other/ext/t",
        "gs://bucket/ext/t",
        "s3a://bucket/ext/%2E%2E/secret",  # '..' once decoded
        "s3a://bucket/ext%2Ft",  # inside only if %2F separates: not in raw form
    ],
)
def test_other_spellings_outside_are_refused(
    layout: tuple[Path, AllowedLocations], location: str
) -> None:
    _, allowed = layout
    assert not allowed.allows(location)
    with pytest.raises(InvalidArgumentError) as caught:
        allowed.check_new_location(location)
    details = caught.value.details
    assert details["reason"] == REASON_NOT_ALLOWED
    assert details["allowed_locations"] == [str(layout[0] / "warehouse"), "s3a://Bucket/ext/"]
    assert "allowed_locations" in str(caught.value)


def test_a_symbolic_link_inside_the_warehouse_does_not_lead_outside(
    layout: tuple[Path, AllowedLocations],
) -> None:
    tmp, allowed = layout
    victim = tmp / "home" / "someone"
    victim.mkdir(parents=True)
    (tmp / "warehouse" / "escape").symlink_to(victim)
    assert not allowed.allows(f"{tmp}/warehouse/escape")
    assert not allowed.allows(f"{tmp}/warehouse/escape/t")
    # The GC's view of a file: its directories are resolved, its last component is not (an
    # unlink removes a link, not its target).
    assert not allowed.allows(f"{tmp}/warehouse/escape/data.parquet", file=True)
    assert allowed.allows(f"{tmp}/warehouse/escape", file=True)


def test_a_root_reached_through_a_symbolic_link_is_the_same_root(tmp_path: Path) -> None:
    real = tmp_path / "mnt" / "disk1"
    real.mkdir(parents=True)
    (tmp_path / "data").symlink_to(tmp_path / "mnt")
    allowed = AllowedLocations.of(warehouse=str(tmp_path / "data" / "disk1"), extra=[])
    assert allowed.allows(f"{real}/ns.db/t")
    assert allowed.allows(f"{tmp_path}/data/disk1/ns.db/t")
    assert not allowed.allows(f"{tmp_path}/mnt/disk2/t")


def test_star_allows_everything_and_the_default_is_the_warehouse_only(tmp_path: Path) -> None:
    anywhere = AllowedLocations.of(warehouse=str(tmp_path), extra=["*"])
    assert anywhere.anywhere and anywhere.describe() == ["*"]
    assert anywhere.allows("/home/someone/important")
    only = AllowedLocations.of(warehouse=str(tmp_path), extra=[])
    assert only.describe() == [str(tmp_path)]
    assert not only.allows("/home/someone/important")
    # No warehouse and no roots: no location at all is allowed (a table without one is).
    nothing = AllowedLocations.of(warehouse="", extra=[])
    assert not nothing.allows("/x")
    nothing.check_new_location("")


def test_a_root_that_names_no_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="not an absolute path"):
        AllowedLocations.of(warehouse="/w", extra=["relative/dir"])


def test_the_gc_deletes_no_file_whose_real_path_is_outside(tmp_path: Path) -> None:
    """Defence in depth (gc_worker point 7): a table inside the warehouse whose directory
    holds a symbolic link leading out, made after its CREATE TABLE was allowed."""
    warehouse = tmp_path / "warehouse"
    table = warehouse / "ns.db" / "t"
    table.mkdir(parents=True)
    victim = tmp_path / "home" / "someone" / "important.parquet"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"user data")
    (table / "escape").symlink_to(victim.parent)
    own = table / "_txn" / "a" / "part-0.parquet"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"ours")
    allowed = AllowedLocations.of(warehouse=str(warehouse), extra=[])
    for location in (str(table), f"file://{table}"):
        deleted = _delete_files(
            location,
            ["escape/important.parquet", "_txn/a/part-0.parquet"],
            leading=lambda: True,
            allowed=allowed,
        )
        assert deleted.removed == ["_txn/a/part-0.parquet"]
        assert victim.read_bytes() == b"user data"
        assert not own.exists()
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_bytes(b"ours")


def test_a_location_reaching_a_live_tables_directory_through_a_link_is_refused(
    tmp_path: Path,
) -> None:
    """The catalog refuses overlapping LOCATION texts; a symbolic link makes two texts one
    directory, so the leader resolves them before it proposes a CreateTable."""
    real = tmp_path / "w" / "t"
    real.mkdir(parents=True)
    (tmp_path / "w" / "alias").symlink_to(real)
    (tmp_path / "w" / "up").symlink_to(tmp_path / "w")
    live = [("ns.t", str(real)), ("ns.u", "s3://bucket/u")]
    for location in (
        f"{tmp_path}/w/alias",
        f"file://{tmp_path}/w/alias/inner",
        f"{tmp_path}/w/up",  # holds ns.t's directory
    ):
        with pytest.raises(InvalidArgumentError) as err:
            check_no_shared_directory(location, live)
        assert err.value.details["reason"] == REASON_SHARES_DIRECTORY
        assert err.value.details["table"] == "ns.t"
    # Texts that overlap are the catalog's to refuse (the same error on every node); other
    # directories and URIs pass.
    for location in (str(real), f"{real}/inner", f"{tmp_path}/w/other", "s3://bucket/u"):
        check_no_shared_directory(location, live)


def test_real_paths_of_many_locations_agree_with_realpath(tmp_path: Path) -> None:
    """`RealPaths` resolves each shared directory once (a CREATE TABLE checks every live
    table's location): the answers must be realpath's, through links to links, relative
    targets with `..`, and components that do not exist."""
    (tmp_path / "w" / "ns").mkdir(parents=True)
    (tmp_path / "w" / "ns" / "t").mkdir()
    (tmp_path / "w" / "link").symlink_to(tmp_path / "w" / "ns")
    (tmp_path / "w" / "rel").symlink_to("ns/../ns/t")
    (tmp_path / "w" / "chain").symlink_to(tmp_path / "w" / "link")
    (tmp_path / "top").symlink_to(tmp_path / "w")
    resolve = RealPaths()
    for rel in (
        "w/ns/t",
        "w/link/t",
        "w/rel",
        "w/rel/x",
        "w/chain/t/missing/deeper",
        "top/chain/t",
        "top/link",
        "nowhere/at/all",
        "w",
    ):
        path = f"{tmp_path}/{rel}"
        assert resolve(path) == os.path.realpath(path), rel
        assert resolve(path) == os.path.realpath(path), rel  # cached
