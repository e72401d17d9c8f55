"""The cluster's secrets: the peer secret and the client tokens, created on first use.

Layout of `secrets_dir` (mode 0700, every file 0600):

    cluster.secret   the peer HMAC secret, 64 hex characters (`raft.transport` reads it with
                     `load_or_create_secret`, which also creates it)
    tokens.json      {"version": 1, "tokens": [{"name", "role", "sha256"}, ...]}: what nodes
                     check client tokens against. Hashes only, never a token.
    admin.token      the plain tokens, one per role, for local use (the CLI reads
    writer.token     admin.token by default). In production they go to the people and jobs
    reader.token     that need them and are deleted from the hosts; nodes never read them.

Creation is race-safe without locks: each file is written completely under a temporary name
and then hard-linked to its final name, which fails if another process got there first; the
loser then reads the winner's file. tokens.json is derived only from the (winning) token files,
so every racer computes the same content. A final name therefore never holds a partial file.
If tokens.json exists it is authoritative and the token files are neither read nor created
(operators may delete them, or add more tokens to tokens.json by hand). A running node reads
tokens.json again on SIGHUP (`Secrets.with_tokens_reloaded`): to revoke a token, remove its
entry on every node and send each SIGHUP; requests on connections already open are checked
against the new list too.

Invariants
    * Nothing here ever loosens a mode: a file or directory that group/other may access is
      refused with `InsecureSecretsError`, naming the `chmod` that fixes it.
    * Existing secrets are never overwritten.
    * `Secrets` holds token hashes, not tokens; `role_for` compares hashes in constant time and
      looks at every record, so timing reveals neither which token matched nor where.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets as _random
import stat
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path
from typing import ClassVar, Final

from raft.errors import InsecureSecretFileError, SecretFileError
from raft.exclusive_file import create_exclusive
from raft.transport import load_or_create_secret

__all__ = [
    "CLUSTER_SECRET_FILE",
    "InsecureSecretsError",
    "Role",
    "Secrets",
    "SecretsError",
    "TOKENS_FILE",
    "TokenRecord",
    "ensure_secrets",
    "hash_token",
    "load_secrets",
    "read_token_file",
    "token_file_name",
]

CLUSTER_SECRET_FILE: Final = "cluster.secret"
TOKENS_FILE: Final = "tokens.json"
TOKENS_FORMAT_VERSION: Final = 1

# ---- limits ----------------------------------------------------------------------------------

# 32 random bytes, URL-safe base64: 43 characters. Longer tokens (hand-made) are accepted up to
# TOKEN_CHARS_MAX; shorter than TOKEN_CHARS_MIN are guessable and refused.
TOKEN_RANDOM_BYTES: Final = 32
TOKEN_CHARS_MIN: Final = 16
TOKEN_CHARS_MAX: Final = 256  # the `hello` op refuses longer tokens (api_limits)
TOKEN_NAME_CHARS_MAX: Final = 128
# A token file or tokens.json bigger than this is not one of ours; refuse rather than read it.
TOKEN_FILE_BYTES_MAX: Final = 4096
TOKENS_JSON_BYTES_MAX: Final = 1024 * 1024
TOKENS_MAX: Final = 1000

_SHA256_HEX_CHARS: Final = 64
_HEX: Final = frozenset("0123456789abcdef")


class SecretsError(Exception):
    """A secrets file or directory cannot be used (malformed, too big, not a regular file)."""

    code: ClassVar[str] = "SECRETS_INVALID"

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        # Default exception pickling replays positional args only; `path` is keyword-only.
        # Picklable errors cross process pools (and Spark) intact.
        return (_rebuild_secrets_error, (type(self), str(self), self.path))


def _rebuild_secrets_error(cls: type[SecretsError], message: str, path: Path) -> SecretsError:
    return cls(message, path=path)


class InsecureSecretsError(SecretsError):
    """A secrets file or directory is accessible by group or others."""

    code: ClassVar[str] = "SECRETS_INSECURE"


class Role(IntEnum):
    """A client token's role. Ordered: a role may do everything the roles below it may."""

    READER = 1
    WRITER = 2
    ADMIN = 3

    @property
    def wire_name(self) -> str:
        """The lower-case name used in tokens.json and in the `hello` reply."""
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> Role:
        """The role for a wire name (`reader`/`writer`/`admin`); ValueError for anything else."""
        for role in cls:
            if role.wire_name == name:
                return role
        raise ValueError(f"unknown role {name!r}: expected one of reader, writer, admin")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    name: str
    role: Role
    sha256: str  # lower-case hex digest of the UTF-8 token


@dataclass(frozen=True, slots=True, kw_only=True)
class Secrets:
    """What a node needs: the peer secret and the token hashes."""

    secrets_dir: Path
    cluster_secret: bytes = field(repr=False)  # never in a traceback or test report
    tokens: tuple[TokenRecord, ...]

    def role_for(self, token: object) -> Role | None:
        """The role of `token`, or None if it is not a valid token (or not a string at all)."""
        record = self.record_for(token)
        return None if record is None else record.role

    def record_for(self, token: object) -> TokenRecord | None:
        """The record (name, role) of `token`, or None if it is not a valid token (or not a
        string at all). The name is who the node knows the caller to be (audit): the client
        name a caller gives is only what it says."""
        if not isinstance(token, str) or not TOKEN_CHARS_MIN <= len(token) <= TOKEN_CHARS_MAX:
            return None
        digest = hash_token(token).encode("ascii")
        found: TokenRecord | None = None
        for record in self.tokens:
            # No early exit: every record is compared, whatever matches.
            if hmac.compare_digest(digest, record.sha256.encode("ascii")):
                found = record
        return found

    def with_tokens_reloaded(self) -> Secrets:
        """These secrets with tokens.json read again (the peer secret is not: changing it
        means restarting every node). SecretsError (InsecureSecretsError) when the file
        cannot be used; the caller keeps the tokens in force then."""
        return replace(self, tokens=_read_tokens_json(self.secrets_dir / TOKENS_FILE))

    def token_file(self, role: Role) -> Path:
        """Where `ensure_secrets` put the plain token of `role` (it may have been removed)."""
        return self.secrets_dir / token_file_name(role)


def token_file_name(role: Role) -> str:
    return f"{role.wire_name}.token"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# ---- public entry points ---------------------------------------------------------------------


def ensure_secrets(secrets_dir: Path) -> Secrets:
    """Load the secrets in `secrets_dir`, creating whatever is missing (see the module doc)."""
    secrets_dir = Path(secrets_dir)
    _ensure_private_dir(secrets_dir)
    cluster_secret = _cluster_secret(secrets_dir)
    tokens_path = secrets_dir / TOKENS_FILE
    if not tokens_path.exists():
        records = []
        for role in Role:
            token = _ensure_token_file(secrets_dir / token_file_name(role))
            records.append(TokenRecord(name=role.wire_name, role=role, sha256=hash_token(token)))
        create_exclusive(tokens_path, _render_tokens_json(records))
    return Secrets(
        secrets_dir=secrets_dir,
        cluster_secret=cluster_secret,
        tokens=_read_tokens_json(tokens_path),
    )


def load_secrets(secrets_dir: Path) -> Secrets:
    """Load existing secrets without creating anything (a production node whose secrets were
    distributed by the operator). Missing files raise SecretsError."""
    secrets_dir = Path(secrets_dir)
    _check_private_dir(secrets_dir)
    secret_path = secrets_dir / CLUSTER_SECRET_FILE
    if not secret_path.exists():
        raise SecretsError(f"{secret_path} is missing", path=secret_path)
    return Secrets(
        secrets_dir=secrets_dir,
        cluster_secret=_cluster_secret(secrets_dir),
        tokens=_read_tokens_json(secrets_dir / TOKENS_FILE),
    )


def read_token_file(path: Path) -> str:
    """The token stored in `path` (surrounding whitespace removed). The file must be private
    (0600 or stricter) and hold one token of sane length."""
    path = Path(path)
    text = _read_private(path, TOKEN_FILE_BYTES_MAX).decode("utf-8", errors="replace").strip()
    if not TOKEN_CHARS_MIN <= len(text) <= TOKEN_CHARS_MAX or any(c.isspace() for c in text):
        raise SecretsError(
            f"{path} does not hold a token (one word of {TOKEN_CHARS_MIN}..{TOKEN_CHARS_MAX} "
            "characters)",
            path=path,
        )
    return text


# ---- internals -------------------------------------------------------------------------------


def _ensure_private_dir(path: Path) -> None:
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkdir's mode passes through the umask; say what we mean. Only a directory we just
        # made is chmod-ed: an existing one is the operator's and is checked, not changed.
        os.chmod(path, 0o700)
    _check_private_dir(path)


def _check_private_dir(path: Path) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SecretsError(f"secrets directory {path} does not exist", path=path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise SecretsError(f"{path} is not a directory", path=path)
    if st.st_mode & 0o077:
        raise InsecureSecretsError(
            f"secrets directory {path} has mode {stat.S_IMODE(st.st_mode):04o}; group and others "
            f"must have no access (chmod 700 {path})",
            path=path,
        )


def _cluster_secret(secrets_dir: Path) -> bytes:
    path = secrets_dir / CLUSTER_SECRET_FILE
    try:
        secret = load_or_create_secret(path)
    except InsecureSecretFileError as exc:
        raise InsecureSecretsError(str(exc), path=path) from exc
    except SecretFileError as exc:
        raise SecretsError(str(exc), path=path) from exc
    return secret


def _ensure_token_file(path: Path) -> str:
    if not path.exists():
        token = _random.token_urlsafe(TOKEN_RANDOM_BYTES)
        create_exclusive(path, (token + "\n").encode("ascii"))
    # Whoever won the race, the file now holds the token everyone uses.
    return read_token_file(path)


def _read_private(path: Path, max_bytes: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SecretsError(f"{path} does not exist", path=path) from None
    except PermissionError:
        raise SecretsError(f"{path} is not readable by this user", path=path) from None
    try:
        # fstat the open file, not the path, so the file checked is the file read.
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretsError(f"{path} is not a regular file", path=path)
        if st.st_mode & 0o077:
            raise InsecureSecretsError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; group and others must have "
                f"no access (chmod 600 {path})",
                path=path,
            )
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SecretsError(f"{path} is larger than {max_bytes} bytes", path=path)
    return data


def _render_tokens_json(records: list[TokenRecord]) -> bytes:
    # Deterministic bytes: racers derive it from the same token files, so their copies agree.
    doc = {
        "version": TOKENS_FORMAT_VERSION,
        "tokens": [{"name": r.name, "role": r.role.wire_name, "sha256": r.sha256} for r in records],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("ascii")


def _read_tokens_json(path: Path) -> tuple[TokenRecord, ...]:
    raw = _read_private(path, TOKENS_JSON_BYTES_MAX)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SecretsError(f"{path} is not valid JSON: {exc}", path=path) from None

    def bad(problem: str) -> SecretsError:
        return SecretsError(f"{path}: {problem}", path=path)

    if not isinstance(doc, dict) or set(doc) != {"version", "tokens"}:
        raise bad('expected an object with exactly "version" and "tokens"')
    if doc["version"] != TOKENS_FORMAT_VERSION:
        raise bad(f"unsupported version {doc['version']!r} (expected {TOKENS_FORMAT_VERSION})")
    entries = doc["tokens"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= TOKENS_MAX:
        raise bad(f'"tokens" must be a list of 1..{TOKENS_MAX} entries')
    records: list[TokenRecord] = []
    names: set[str] = set()
    hashes: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"name", "role", "sha256"}:
            raise bad(f'tokens[{i}] must have exactly "name", "role" and "sha256"')
        name, role_name, digest = entry["name"], entry["role"], entry["sha256"]
        if not isinstance(name, str) or not 1 <= len(name) <= TOKEN_NAME_CHARS_MAX:
            raise bad(f"tokens[{i}].name must be a string of 1..{TOKEN_NAME_CHARS_MAX} chars")
        if not isinstance(role_name, str):
            raise bad(f"tokens[{i}].role must be a string")
        try:
            role = Role.parse(role_name)
        except ValueError as exc:
            raise bad(f"tokens[{i}].role: {exc}") from None
        if (
            not isinstance(digest, str)
            or len(digest) != _SHA256_HEX_CHARS
            or not set(digest) <= _HEX
        ):
            raise bad(f"tokens[{i}].sha256 must be {_SHA256_HEX_CHARS} lower-case hex digits")
        if name in names:
            raise bad(f"tokens[{i}].name {name!r} appears twice")
        if digest in hashes:
            raise bad(f"tokens[{i}].sha256 appears twice (one token, two roles)")
        names.add(name)
        hashes.add(digest)
        records.append(TokenRecord(name=name, role=role, sha256=digest))
    return tuple(records)
