"""Where a transaction's Parquet files go, and what a commit says about them.

Each write of a batch goes to a fresh directory `<table location>/_txn/<attempt id>/`, unique per
attempt, so a retried or replayed batch never mixes files with an earlier attempt. Files become
part of the table only when a commit lists them; a directory no commit references is garbage for
GC and never shown to readers (readers read exactly the committed file list).

Paths in a commit are relative to the table location (portable if the warehouse moves).

Whether a committed file carries Parquet field ids (else readers match it by name) is read from
one footer per Spark write job (`field_id_group`), not per directory: a directory may mix both.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow.fs as pafs
import pyarrow.parquet as pq

# One rule for a committed file's path, shared with the readers (re-exported for the bridge).
from metastore.client.parquet import absolute as absolute
from metastore.client.parquet import filesystem

TXN_DIR = "_txn"
# A single commit lists at most this many files per table (the metastore refuses more anyway).
FILES_PER_WRITE_MAX = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DataFile:
    path: str  # relative to the table location
    size_bytes: int
    row_count: int

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "size_bytes": self.size_bytes, "row_count": self.row_count}


def new_attempt_dir(location: str, txn_id: str, *, owner: str = "") -> tuple[str, str]:
    """(absolute dir, dir relative to the location) for one write attempt. With `owner` (the
    writer's metastore session id) the directory is `_txn/<owner>--<txn>-<random>`: GC never
    deletes it as an orphan while that session lives, however long the batch runs."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in txn_id)[:80]
    # "--" separates an owner from the rest: without one, a txn id's "--" would name a session
    # that is never live (GC's orphan scan, and the metastore refuses the commit).
    while "--" in safe:
        safe = safe.replace("--", "-_")
    rel = f"{TXN_DIR}/{safe}-{uuid.uuid4().hex[:12]}"
    if owner and all(ch.isalnum() or ch in "-_" for ch in owner) and "--" not in owner:
        rel = f"{TXN_DIR}/{owner}--{safe}-{uuid.uuid4().hex[:12]}"
    return f"{location.rstrip('/')}/{rel}", rel


def delete_attempt_dir(location: str, rel_dir: str) -> None:
    """Delete the attempt directory `rel_dir` (as `new_attempt_dir` made it) under `location`
    and everything in it; one already gone counts as deleted. Only for a directory no commit
    references or ever will (the caller knows its commit was refused). ValueError for
    anything but one `_txn/<attempt>` directory."""
    parts = rel_dir.split("/")
    if len(parts) != 2 or parts[0] != TXN_DIR or parts[1] in ("", ".", ".."):
        raise ValueError(f"{rel_dir!r} is no attempt directory ({TXN_DIR}/<attempt>)")
    fs, root = _fs(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(f"{root.rstrip('/')}/{rel_dir}")


def delete_files(location: str, rel_paths: Iterable[str]) -> None:
    """Delete these files (paths relative to `location`, as `collect_files` gives them); one
    already gone counts as deleted. Only for files no commit references or ever will."""
    fs, root = _fs(location)
    for rel in rel_paths:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{root.rstrip('/')}/{rel}")


# Characters Spark's file readers take as a glob in a path (Hadoop's GlobPattern).
_GLOB_CHARS = frozenset("{}[]*?\\")


def spark_path(path: str) -> str:
    """`path` for Spark's file readers (`spark.read.parquet`): they expand a path with glob
    characters, so a location like `/wh/t[1]` named no file; escaped, it is read literally."""
    return "".join("\\" + ch if ch in _GLOB_CHARS else ch for ch in path)


def _fs(location: str) -> tuple[pafs.FileSystem, str]:
    # The readers' rule: a `file://` location's path is taken literally, as Spark wrote it.
    return filesystem(location)


def collect_files(location: str, rel_dir: str) -> list[DataFile]:
    """The Parquet files Spark wrote under location/rel_dir, with sizes and row counts read from
    their footers (not from Spark's metrics: the footer is what a reader will see).

    Spark creates the directory of every successful write, an empty one included: a directory
    not found raises FileNotFoundError (the driver sees another filesystem than the one Spark
    wrote to), never "no files", which would commit none of the written rows."""
    fs, root = _fs(location)
    base = f"{root.rstrip('/')}/{rel_dir}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"the write's directory {base} is not there after Spark wrote it: the driver sees "
            f"another filesystem than Spark's for location {location!r} ({exc})"
        ) from exc
    out = []
    for info in sorted(infos, key=lambda i: i.path):
        name = info.base_name
        if info.type != pafs.FileType.File or not name.endswith(".parquet"):
            continue
        # Hidden as Spark's readers hide them: a `_`/`.` file, or any file under such a
        # directory (a commit protocol's `_temporary/` or `.spark-staging-*` left behind);
        # a partition directory of a column named `_x` (`_x=1`) is not hidden (Spark's
        # InMemoryFileIndex keeps `_` names holding `=`).
        below = info.path[len(base.rstrip("/")) + 1 :].split("/")
        if any(_hidden(part) for part in below):
            continue
        with fs.open_input_file(info.path) as f:
            rows = pq.ParquetFile(f).metadata.num_rows
        rel = info.path[len(root.rstrip("/")) + 1 :]
        out.append(DataFile(path=rel, size_bytes=int(info.size or 0), row_count=int(rows)))
    if len(out) > FILES_PER_WRITE_MAX:
        raise ValueError(
            f"{len(out)} files written under {base}; the limit per write is {FILES_PER_WRITE_MAX}"
            " (coalesce/repartition the output)"
        )
    return out


PARQUET_FIELD_ID_KEY = b"PARQUET:field_id"


def top_level_field_ids(location: str, rel_path: str) -> frozenset[int]:
    """The Parquet field ids of a data file's top-level columns, from its footer alone (pyarrow
    shows each as the field's `PARQUET:field_id` metadata). A file written without field ids
    has none."""
    fs, path = _fs(absolute(location, rel_path))
    with fs.open_input_file(path) as f:
        schema = pq.read_schema(f)
    ids = set()
    for fld in schema:
        value = (fld.metadata or {}).get(PARQUET_FIELD_ID_KEY)
        if value is not None:
            ids.add(int(value))
    return frozenset(ids)


# The name Spark gives each file of one write job: `part-<split>-<the job's UUID>` and a suffix
# (`-c000.snappy.parquet`, a bucket's `_00001.c000...`). A streaming file sink: a UUID per file.
_SPARK_JOB_FILE = re.compile(
    r"part-\d+-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?![0-9a-f])"
)


def job_file_name(job: str) -> str:
    """A unique name for a file of write job `job` (a UUID) written by other code than Spark's
    writer (the data source's tasks), in Spark's shape, so `field_id_group` takes the job's
    files as one: the caller writes all of them alike (with field ids)."""
    return f"part-00000-{job}-{uuid.uuid4().hex}.parquet"


def field_id_group(rel_path: str) -> str:
    """The files one footer speaks for, as to whether they carry Parquet field ids: those one
    Spark write job wrote into one directory (a `_txn/<attempt>/` directory with its partition
    directories, else the file's own directory), known by the job's UUID in their names. One
    job writes one DataFrame under one `spark.sql.parquet.fieldId.write.enabled`: all its files
    carry field ids (a conformed write) or none (a plain `df.write.parquet`). Any other file is
    judged on its own: a directory may hold files of several writes of both kinds (a plain
    `df.write.mode("append").parquet` into it, another tool's file), so a directory is not one
    kind. A read of a table of a million files Spark wrote reads a footer per write job. The
    group of a job is named with a `./` segment, which no committed file's path has."""
    directory, _, name = rel_path.rpartition("/")
    job = _SPARK_JOB_FILE.match(name)
    if job is None:
        return rel_path
    parts = rel_path.split("/")
    if len(parts) >= 3 and parts[0] == TXN_DIR and "://" not in rel_path:
        directory = f"{parts[0]}/{parts[1]}"
    return f"{directory}/./{job.group(1)}" if directory else f"./{job.group(1)}"


# A footer's verdict: None (unreadable), False (field ids), True (read by name), or, read by
# name, the groups of its fields one name matches case-insensitively, as paths from the
# top-level column (`("id",), ("ID",)`; nested: `("s", "a"), ("s", "A")`).
FooterVerdict: TypeAlias = bool | tuple[tuple[tuple[str, ...], ...], ...] | None


def footer_verdict(path: str) -> FooterVerdict:
    """Whether the file at `path` (absolute) is read by name (it has no field ids: the CLI's
    rule, `metastore.client.parquet.matched_by_name`), and if so the groups of its fields, at
    any level, whose names differ only in case (`metastore.client.parquet.name_clash_paths`: a
    pinned column or nested field matching one of them cannot be read), in place of True; None
    when its footer cannot be read, so the read itself reports the file (or skips it, as the
    session's `spark.sql.files.ignoreMissingFiles` / `ignoreCorruptFiles` say). Runs on
    executors too."""
    from metastore.client.parquet import (
        DataReadError,
        file_schema,
        matched_by_name,
        name_clash_paths,
    )

    try:
        schema = file_schema(path)
    except DataReadError:
        return None
    if not matched_by_name(schema):
        return False
    return name_clash_paths(schema) or True


def footer_verdicts(
    probes: Iterable[tuple[str, str]], threads: int
) -> list[tuple[str, FooterVerdict]]:
    """(key, `footer_verdict(path)`) of each (key, path), `threads` footers at a time: footer
    reads wait on storage (an object store's latency), not on the CPU."""
    items = list(probes)
    if len(items) <= 1:
        return [(key, footer_verdict(path)) for key, path in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        verdicts = list(pool.map(lambda item: footer_verdict(item[1]), items))
    return [(key, v) for (key, _), v in zip(items, verdicts, strict=True)]


def take_chunk(
    files: list[dict[str, Any]], *, files_max: int, bytes_max: int
) -> list[dict[str, Any]]:
    """The first entries of `files` (as `files` lists them) within `files_max` files and
    `bytes_max` bytes, and at least one: what one rewrite commit (a backfill's, an optimize's)
    takes on."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for f in files:
        size += int(f.get("size_bytes") or 0)
        if chunk and (len(chunk) >= files_max or size > bytes_max):
            break
        chunk.append(f)
    return chunk


def rows_not_kept(
    chunk: Sequence[Mapping[str, Any]], written: Sequence[DataFile]
) -> dict[str, int]:
    """{} when the files `written` hold as many rows as the entries of `chunk` (the files a
    rewrite removes) record; else `rows_expected` and `rows_read`. A session that skips
    unreadable files (`spark.sql.files.ignoreCorruptFiles` / `ignoreMissingFiles`) reads a
    damaged one as no rows (or some), and a swap removing it would lose them at every later
    timestamp: optimize and the backfill commit nothing then."""
    expected = sum(int(f.get("row_count") or 0) for f in chunk)
    read = sum(int(f.row_count) for f in written)
    return {} if read == expected else {"rows_expected": expected, "rows_read": read}


def _hidden(name: str) -> bool:
    """A path component Spark's file listing skips (`.x`, `_x`, but not `_x=1`)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)
