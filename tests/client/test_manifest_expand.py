"""The columnar expansion of a `files` reply (the default, for speed) answers exactly what the
entry-by-entry reference (`metastore.manifests.expand`) answers: same files, same order, same
totals, whatever mix of manifest entries removed in place, truncated manifests, delete entries
and loose files, at any timestamp."""

from __future__ import annotations

import tempfile
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.client.manifest_files import expand_reply, read_manifest, write_manifest
from metastore.manifests import ManifestRef
from metastore.txn import FileEntry

BASE_TS = 1 << 40


@st.composite
def replies(draw: st.DrawFn) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="expand-")
    ts = BASE_TS
    refs: list[ManifestRef] = []
    paths: list[str] = []
    for m in range(draw(st.integers(1, 4))):
        entries = []
        for i in range(draw(st.integers(1, 12))):
            ts += draw(st.integers(0, 2))  # several files of one commit share a ts
            removed = draw(st.one_of(st.none(), st.integers(ts + 1, ts + 40)))
            path = f"_txn/m{m}/f{i}.parquet"
            paths.append(path)
            entries.append(
                FileEntry(
                    path=path, size_bytes=i + 1, row_count=2 * i, added_ts=ts, removed_ts=removed
                )
            )
        ref = write_manifest(directory, entries)
        if draw(st.booleans()) and draw(st.booleans()):
            ref = replace(ref, removed_all_ts=ts + draw(st.integers(1, 30)))
        refs.append(ref)
    loose = []
    for i in range(draw(st.integers(0, 6))):
        ts += draw(st.integers(0, 2))
        loose.append(
            {"path": f"_txn/loose/{i}.parquet", "size_bytes": 7, "row_count": 3, "added_ts": ts}
        )
    deleted = draw(st.lists(st.sampled_from(paths), unique=True, max_size=len(paths)))
    deletes = [[p, BASE_TS + draw(st.integers(0, ts - BASE_TS + 20))] for p in deleted]
    as_of = BASE_TS + draw(st.integers(0, ts - BASE_TS + 40))
    return {
        "as_of": as_of,
        "location": directory,
        "files": [f for f in loose if f["added_ts"] <= as_of],
        "deletes": deletes,
        "manifests": [r.to_view() for r in refs],
    }


@settings(max_examples=150, deadline=None)
@given(replies())
def test_columnar_expansion_equals_the_entry_by_entry_reference(reply: dict[str, object]) -> None:
    fast = expand_reply(reply)
    reference = expand_reply(reply, read=read_manifest)
    assert fast["files"] == reference["files"]
    for key in ("total_files", "rows", "size_bytes", "expanded_manifests"):
        assert fast[key] == reference[key], key
