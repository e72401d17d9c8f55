"""The pure parts of `make upgrade-check` (tests/upgrade/upgrade_check.py): the revision check,
the comparison of the nodes' answers, the report. The check itself runs real daemons of two
releases and is not part of `make test`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.upgrade.upgrade_check import (
    EXIT_NO_REVISION,
    Cluster,
    RevisionMissing,
    StepOutcome,
    differences,
    export_tree,
    main,
    render_table,
    resolve_revision,
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


@pytest.fixture
def shallow_clone(tmp_path: Path) -> tuple[Path, str]:
    """A clone of depth 1 of a repository of two commits; the first commit's id."""
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q")
    for n in (1, 2):
        (origin / "f.txt").write_text(f"{n}\n")
        _git(origin, "add", "f.txt")
        _git(origin, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{n}")
    first = _git(origin, "rev-parse", "HEAD~1")
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", "--depth", "1", f"file://{origin}", str(clone))
    return clone, first


def test_a_revision_of_this_clone_resolves_to_its_commit() -> None:
    assert resolve_revision("HEAD") == _git(Path(__file__).parent, "rev-parse", "HEAD")


def test_a_missing_revision_is_refused_naming_it() -> None:
    with pytest.raises(RevisionMissing, match="'no-such-rev-xyz' is not in this clone"):
        resolve_revision("no-such-rev-xyz")


def test_an_option_is_not_taken_for_a_revision() -> None:
    with pytest.raises(RevisionMissing, match="give a git revision"):
        resolve_revision("--all")


def test_a_shallow_clone_is_told_to_fetch_the_older_commits(
    shallow_clone: tuple[Path, str],
) -> None:
    clone, first = shallow_clone
    with pytest.raises(RevisionMissing, match="shallow: `git fetch --unshallow`"):
        resolve_revision(first[:10], repo=clone)


def test_main_exits_2_with_the_reason_when_the_revision_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--from", "no-such-rev-xyz"]) == EXIT_NO_REVISION
    assert "not in this clone" in capsys.readouterr().err


def test_export_tree_writes_the_revisions_files(shallow_clone: tuple[Path, str]) -> None:
    clone, _ = shallow_clone
    export_tree("HEAD", clone.parent / "exported", repo=clone)
    assert (clone.parent / "exported" / "f.txt").read_text() == "2\n"


def test_node_local_fields_are_not_compared() -> None:
    answers = {
        1: {"files t @ 5": {"files": ["a"], "safe_time": 10, "waited_ms": 3}},
        2: {"files t @ 5": {"files": ["a"], "safe_time": 12, "waited_ms": 0}},
    }
    assert differences(answers) == []


def test_a_different_value_is_a_divergence() -> None:
    answers = {1: {"files t @ 5": {"files": ["a"]}}, 2: {"files t @ 5": {"files": ["b"]}}}
    (diff,) = differences(answers, {1: "old", 2: "new"})
    assert not diff.shape_only
    assert "node 2" in diff.describe()


def test_a_read_one_node_did_not_answer_is_a_divergence() -> None:
    answers = {1: {"history t": {"versions": []}}, 2: {}}
    (diff,) = differences(answers)
    assert diff.read == "history t" and not diff.shape_only


def test_a_field_only_the_new_release_sends_is_a_difference_of_shape() -> None:
    answers = {
        1: {"watch": {"events": [{"index": 5, "kind": "x"}]}},
        2: {"watch": {"events": [{"index": 5, "kind": "x", "event": 0}]}},
        3: {"watch": {"events": [{"index": 5, "kind": "x", "event": 0}]}},
    }
    (diff,) = differences(answers, {1: "old", 2: "new", 3: "new"})
    assert diff.shape_only and diff.fields_not_everywhere == {"event"}


def test_an_extra_field_within_one_release_is_a_divergence() -> None:
    answers = {1: {"r": {"a": 1}}, 2: {"r": {"a": 1, "b": 2}}}
    (diff,) = differences(answers, {1: "new", 2: "new"})
    assert not diff.shape_only


def test_a_refusal_beside_an_answer_is_never_a_difference_of_shape() -> None:
    answers = {1: {"r": {"error": "TABLE_NOT_FOUND"}}, 2: {"r": {"version": 1}}}
    (diff,) = differences(answers, {1: "old", 2: "new"})
    assert not diff.shape_only


def test_the_report_lists_steps_and_the_problems_of_failed_ones() -> None:
    steps = [
        StepOutcome(step="old cluster", nodes="1:old* 2:old 3:old", writes="9/9 ok"),
        StepOutcome(step="node 1 -> new", problems=["answers differ\n  files t @ 5"]),
    ]
    table = render_table(steps)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["step", "nodes"]
    assert "ok" in lines[2] and "FAILED" in lines[3]
    assert "[node 1 -> new] answers differ" in table


def _cluster_with_log(tmp_path: Path, lines: list[dict[str, object]]) -> Cluster:
    cluster = Cluster(tmp_path, tmp_path / "old-tree")
    log = cluster.config_dir / "data" / "node-1" / "node.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return cluster


def test_error_records_are_told_apart_by_the_release_whose_process_wrote_them(
    tmp_path: Path,
) -> None:
    cluster = _cluster_with_log(
        tmp_path,
        [
            {"level": "info", "pid": 7, "msg": "node started"},
            {"level": "error", "pid": 7, "msg": "Exception in callback <f at 0x7f01>\nTraceback"},
            {"level": "critical", "msg": "stopped on a fatal error"},  # a release without pids
        ],
    )
    cluster.release_of_pid[7] = "new"
    assert cluster.new_log_problems() == {
        "new": ["node-1: Exception in callback <f>"],
        "old": ["node-1: stopped on a fatal error"],
    }
    assert cluster.new_log_problems() == {}  # each record once


def test_the_snapshots_a_node_holds_are_read_from_its_wal(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, tmp_path / "old-tree")
    wal = cluster.config_dir / "data" / "node-2" / "wal"
    wal.mkdir(parents=True)
    for name in ("snap-000000000000012c.snap", "snap-x.snap", "wal-0000000000000002.log"):
        (wal / name).write_bytes(b"")
    assert cluster.snapshot_indexes(2) == {300}
