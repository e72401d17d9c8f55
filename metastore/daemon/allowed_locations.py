"""Where tables may live: the operator's `allowed_locations` (cluster.toml), checked on the leader.

`CREATE TABLE ... LOCATION` needs only the writer role, and the leader's GC deletes, with the
daemon's own rights, the files a table's removed entries name under its location. Without a
bound a writer could point a table at any directory the daemon can reach (`/home/someone`),
commit the files there and have the GC delete them past the table's TTL. So, as catalogs do
(Hive's warehouse and external locations, Unity Catalog's external locations), the operator
names the roots table locations may lie in: the warehouse always, plus `allowed_locations`
(`["*"]`: anywhere, the behaviour before this setting existed).

Enforced where a new location enters the cluster, on the leader: a DDL's CreateTable before
the leader proposes it, and a CreateTable sent through the internal `_propose` op
(metastore.daemon.server). Not in `apply`: this is node configuration, not replicated state,
and a table created before the setting (or before a root was removed from it) stays readable
and writable. The GC (metastore.daemon.gc_worker) checks again before each deletion: it
leaves a table whose location is outside the roots alone (reported as skipped, logged), and
never deletes a file whose real path is outside them (a symbolic link made inside an allowed
directory after the CREATE TABLE).

Comparing locations (so a prefix check cannot be fooled):
* segment-wise: `/data/warehouse-evil` is not inside `/data/warehouse`;
* local paths (and `file://` URIs, the scheme in any case) with symbolic links resolved, on
  both sides, at the time of the check (`os.path.realpath`; `..` after a link is resolved as
  the kernel does); the last component of a file the GC deletes is not followed (an unlink
  removes a link, not its target);
* other URIs by their text: the scheme and authority (bucket, host) lowercased, Spark's
  `s3a://`/`s3n://` read as `s3://` (pyarrow's name for the same store, which the GC uses);
  and a URI is inside a root only when both its raw text and its percent-decoded text are
  (stores differ on whether `%2F` is a separator), and never when decoding yields an empty,
  `.` or `..` segment.
Trailing slashes do not matter anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from metastore.errors import InvalidArgumentError

__all__ = [
    "ANYWHERE",
    "ANY_LOCATION",
    "REASON_NOT_ALLOWED",
    "REASON_SHARES_DIRECTORY",
    "AllowedLocations",
    "RealPaths",
    "check_no_shared_directory",
]

# The one entry of `allowed_locations` that allows every location.
ANY_LOCATION: Final = "*"
# `details.reason` of the refusal.
REASON_NOT_ALLOWED: Final = "location_not_allowed"
# `details.reason` of a new location that reaches a live table's directory through a link.
REASON_SHARES_DIRECTORY: Final = "location_shares_directory"
# Spark's names for the S3 store, which pyarrow (and so the GC) calls s3
# (metastore.client.parquet `pyarrow_uri`).
_SCHEME_ALIASES: Final = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True, slots=True)
class _Local:
    """A local directory, as configured (symbolic links are resolved at each check)."""

    path: str


@dataclass(frozen=True, slots=True)
class _Uri:
    """A location of an object store or remote file system: its raw and percent-decoded forms,
    each `scheme://authority/path` with the scheme and authority lowercased, no trailing '/'."""

    raw: str
    decoded: str


def _parse(location: str) -> _Local | _Uri | None:
    """The normal form of `location` (an absolute path or a URI); None when it names no
    directory a prefix check can judge (a relative path, a file URI with a host, a URI whose
    decoded path has empty, '.' or '..' segments)."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        return _Local(location) if location.startswith("/") else None
    scheme = scheme.lower()
    if scheme == "file":
        return _Local(rest) if rest.startswith("/") else None
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    authority, slash, path = rest.partition("/")
    path = path.rstrip("/")
    decoded = unquote(path)
    if path and any(seg in ("", ".", "..") for seg in decoded.split("/")):
        return None
    head = f"{scheme}://{authority.lower()}"
    return _Uri(
        raw=f"{head}/{path}" if slash and path else head,
        decoded=f"{head}/{decoded}" if slash and path else head,
    )


def _inside(inner: str, outer: str) -> bool:
    """Segment-wise containment of two normalised paths or URIs (no trailing '/')."""
    outer = outer.rstrip("/")
    return inner == outer or inner.startswith(outer + "/") or outer == ""


def _real(path: str, *, follow_last: bool) -> str:
    if follow_last:
        return os.path.realpath(path)
    # An unlink removes a link, not what it points at: resolve the directories only.
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


@dataclass(frozen=True, slots=True)
class AllowedLocations:
    """The roots table locations may lie in. `roots` as the operator wrote them (absolute
    paths or URIs: the warehouse first); `anywhere`: every location is allowed (`["*"]`,
    and the default of a server or GC built without a config, as in unit tests)."""

    roots: tuple[str, ...] = ()
    anywhere: bool = False

    @classmethod
    def of(cls, *, warehouse: str, extra: Iterable[str]) -> AllowedLocations:
        """The warehouse (where tables without LOCATION go; "" = none) and the configured
        `allowed_locations`; `*` among them allows everything."""
        extra = tuple(extra)
        if ANY_LOCATION in extra:
            return cls(anywhere=True)
        roots = tuple(dict.fromkeys(r for r in (warehouse, *extra) if r))
        for root in roots:
            if _parse(root) is None:
                raise ValueError(f"{root!r} is not an absolute path or a URI of a directory")
        return cls(roots=roots)

    def describe(self) -> list[str]:
        """What the operator allowed, for messages: `["*"]` or the roots."""
        return [ANY_LOCATION] if self.anywhere else list(self.roots)

    def allows(self, location: str, *, file: bool = False) -> bool:
        """Whether `location` (a table's location, or with `file` a file the GC would delete
        under one, whose last component is not followed) lies inside an allowed root, by the
        rules of the module docstring."""
        if self.anywhere:
            return True
        target = _parse(location)
        if target is None:
            return False
        for root in self.roots:
            parsed = _parse(root)
            if isinstance(target, _Local) and isinstance(parsed, _Local):
                real = _real(target.path, follow_last=not file)
                if _inside(real, os.path.realpath(parsed.path)):
                    return True
            elif (
                isinstance(target, _Uri)
                and isinstance(parsed, _Uri)
                and _inside(target.raw, parsed.raw)
                and _inside(target.decoded, parsed.decoded)
            ):
                return True
        return False

    def check_new_location(self, location: str, what: str = "LOCATION") -> None:
        """Refuse a new table's `location` outside the allowed roots: InvalidArgumentError
        with details `reason` (`location_not_allowed`), `location` and `allowed_locations`.
        Not FORBIDDEN: no role may create a table there (an admin neither), and the same
        location is refused the same way in every session, as an unusable argument is."""
        if not location or self.allows(location):
            return
        allowed = self.describe()
        raise InvalidArgumentError(
            f"{what} {location[:200]!r} is outside the locations this cluster allows tables in "
            f"({', '.join(allowed)}): put the table under one of them, or ask an operator to "
            "add its directory to allowed_locations in cluster.toml",
            details={
                "reason": REASON_NOT_ALLOWED,
                "location": location[:200],
                "allowed_locations": allowed,
            },
        )


# Every location allowed: `["*"]`, and the default of a server or GC built without a config.
ANYWHERE: Final = AllowedLocations(anywhere=True)


class RealPaths:
    """`os.path.realpath` of many normalised absolute paths that share directories (a
    catalog's table locations), each directory resolved once: one `lstat` per new path
    component instead of one per component of every path (100k locations under one warehouse:
    a fraction of a second, not seconds). I/O: call it from a thread."""

    def __init__(self) -> None:
        self._real: dict[str, str] = {"": ""}

    def __call__(self, path: str) -> str:
        real = self._real.get(path)
        if real is not None:
            return real
        parent, _, name = path.rpartition("/")
        candidate = f"{self(parent)}/{name}"
        # A link resolves in full (its target may hold links and `..`); any other component,
        # existing or not, stays as it is below its resolved parent, as realpath does.
        real = os.path.realpath(candidate) if os.path.islink(candidate) else candidate
        self._real[path] = real
        return real


def check_no_shared_directory(location: str, live: Iterable[tuple[str, str]]) -> None:
    """Refuse a new table's local `location` whose real directory (symbolic links resolved)
    is, lies inside or holds that of a live table ((name, location) pairs of `live`) though
    their texts do not overlap: the catalog's rule ("no two live tables share a directory",
    metastore.catalog) compares texts in apply, which cannot resolve links, and the GC keeps
    a table's files by its own entries (`/w/alias` -> `/w/t` beside `/w/t`: either table's
    GC would take the other's files for its own or for orphans). InvalidArgumentError like
    the catalog's, with details `reason` `location_shares_directory` and the real paths.
    Texts that overlap are left to the catalog (its error, on every node alike); URIs are
    compared by text only (a store has no links)."""
    new = _parse(location)
    if not isinstance(new, _Local):
        return
    new_text = os.path.normpath(new.path)
    new_real = os.path.realpath(new.path)
    resolve = RealPaths()
    for name, held in live:
        other = _parse(held)
        if not isinstance(other, _Local):
            continue
        held_text = os.path.normpath(other.path)
        if _inside(new_text, held_text) or _inside(held_text, new_text):
            continue  # the catalog refuses it, with its own error
        held_real = resolve(held_text)
        if _inside(new_real, held_real) or _inside(held_real, new_real):
            raise InvalidArgumentError(
                f"location {location[:200]!r} overlaps the location {held[:200]!r} of table "
                f"{name} through a symbolic link (both are {new_real[:200]!r} or inside it): "
                "two tables may not share a directory",
                details={
                    "reason": REASON_SHARES_DIRECTORY,
                    "location": location[:200],
                    "table": name,
                    "held": held[:200],
                    "real_location": new_real[:200],
                    "real_held": held_real[:200],
                },
            )
