"""metastore.daemon.secrets: creation with private modes, hashes only in tokens.json, roles,
refusal of readable files, and racing creators that all end up with the same secrets."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import stat
import time
from pathlib import Path

import pytest

from metastore.daemon.secrets import (
    InsecureSecretsError,
    Role,
    SecretsError,
    ensure_secrets,
    hash_token,
    load_secrets,
    read_token_file,
)
from raft.transport import load_or_create_secret

ROLES = (Role.READER, Role.WRITER, Role.ADMIN)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_use_creates_private_files(tmp_path: Path) -> None:
    d = tmp_path / "a" / "secrets"
    s = ensure_secrets(d)
    assert mode(d) == 0o700
    names = sorted(p.name for p in d.iterdir())
    assert names == [
        "admin.token",
        "cluster.secret",
        "reader.token",
        "tokens.json",
        "writer.token",
    ]
    for p in d.iterdir():
        assert mode(p) == 0o600, p
    secret = (d / "cluster.secret").read_text().strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert s.cluster_secret == secret.encode()


def test_cluster_secret_is_compatible_with_the_transport(tmp_path: Path) -> None:
    s = ensure_secrets(tmp_path / "s")
    assert load_or_create_secret(tmp_path / "s" / "cluster.secret") == s.cluster_secret


def test_an_existing_transport_secret_is_kept(tmp_path: Path) -> None:
    d = tmp_path / "s"
    made_by_transport = load_or_create_secret(d / "cluster.secret")
    assert ensure_secrets(d).cluster_secret == made_by_transport


def test_tokens_json_holds_hashes_only(tmp_path: Path) -> None:
    d = tmp_path / "s"
    s = ensure_secrets(d)
    text = (d / "tokens.json").read_text()
    doc = json.loads(text)
    assert doc["version"] == 1
    assert {e["role"] for e in doc["tokens"]} == {"reader", "writer", "admin"}
    for role in ROLES:
        token = read_token_file(s.token_file(role))
        assert token not in text
        assert hash_token(token) in text
    assert s.cluster_secret.decode() not in text


def test_role_for(tmp_path: Path) -> None:
    s = ensure_secrets(tmp_path / "s")
    for role in ROLES:
        assert s.role_for(read_token_file(s.token_file(role))) is role
    admin = read_token_file(s.token_file(Role.ADMIN))
    assert s.role_for(admin + "x") is None
    assert s.role_for("") is None
    assert s.role_for("short") is None
    assert s.role_for("y" * 10_000) is None
    assert s.role_for(None) is None
    assert s.role_for(b"bytes-are-not-a-token-at-all") is None


def test_roles_are_ordered() -> None:
    assert Role.READER < Role.WRITER < Role.ADMIN
    assert [Role.parse(r.wire_name) for r in ROLES] == list(ROLES)
    with pytest.raises(ValueError, match="unknown role"):
        Role.parse("root")


def test_ensure_is_idempotent(tmp_path: Path) -> None:
    d = tmp_path / "s"
    first = ensure_secrets(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    second = ensure_secrets(d)
    assert second == first
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_existing_tokens_json_is_authoritative(tmp_path: Path) -> None:
    d = tmp_path / "s"
    first = ensure_secrets(d)
    admin = read_token_file(first.token_file(Role.ADMIN))
    # Production: plain tokens are handed out and deleted from the node.
    for role in ROLES:
        first.token_file(role).unlink()
    again = ensure_secrets(d)
    assert again.tokens == first.tokens
    assert not first.token_file(Role.ADMIN).exists()
    assert again.role_for(admin) is Role.ADMIN


def test_hand_added_tokens_are_honoured(tmp_path: Path) -> None:
    d = tmp_path / "s"
    ensure_secrets(d)
    doc = json.loads((d / "tokens.json").read_text())
    doc["tokens"].append(
        {"name": "etl-job", "role": "writer", "sha256": hash_token("etl-token-0123456789")}
    )
    (d / "tokens.json").write_text(json.dumps(doc))
    assert ensure_secrets(d).role_for("etl-token-0123456789") is Role.WRITER


def test_load_secrets_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(SecretsError, match="does not exist"):
        load_secrets(tmp_path / "none")
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    with pytest.raises(SecretsError, match="missing"):
        load_secrets(d)
    assert list(d.iterdir()) == []
    made = ensure_secrets(d)
    assert load_secrets(d) == made


@pytest.mark.parametrize("name", ["cluster.secret", "tokens.json"])
@pytest.mark.parametrize("loose", [0o640, 0o604, 0o644])
def test_files_readable_by_others_are_refused(tmp_path: Path, name: str, loose: int) -> None:
    d = tmp_path / "s"
    ensure_secrets(d)
    os.chmod(d / name, loose)
    with pytest.raises(InsecureSecretsError, match="chmod 600") as info:
        ensure_secrets(d)
    assert info.value.path == d / name
    assert info.value.code == "SECRETS_INSECURE"
    assert mode(d / name) == loose  # never "fixed" silently


def test_a_readable_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    ensure_secrets(d)
    os.chmod(d, 0o755)
    with pytest.raises(InsecureSecretsError, match="chmod 700"):
        ensure_secrets(d)


def test_a_readable_token_file_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    s = ensure_secrets(d)
    os.chmod(s.token_file(Role.READER), 0o644)
    with pytest.raises(InsecureSecretsError):
        read_token_file(s.token_file(Role.READER))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "exactly"),
        (b'{"version": 2, "tokens": []}', "unsupported version"),
        (b'{"version": 1, "tokens": []}', "1..1000"),
        (b'{"version": 1, "tokens": [{"name": "a", "role": "admin"}]}', "exactly"),
        (
            b'{"version": 1, "tokens": [{"name": "a", "role": "god", "sha256": "'
            + b"0" * 64
            + b'"}]}',
            "unknown role",
        ),
        (b'{"version": 1, "tokens": [{"name": "a", "role": "admin", "sha256": "xyz"}]}', "hex"),
        (
            b'{"version": 1, "tokens": [{"name": "", "role": "admin", "sha256": "'
            + b"0" * 64
            + b'"}]}',
            "name",
        ),
    ],
)
def test_malformed_tokens_json_is_refused(tmp_path: Path, content: bytes, words: str) -> None:
    d = tmp_path / "s"
    ensure_secrets(d)
    (d / "tokens.json").write_bytes(content)
    with pytest.raises(SecretsError, match=words):
        ensure_secrets(d)


def test_duplicate_hashes_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    ensure_secrets(d)
    h = hash_token("some-token-0123456789")
    doc = {
        "version": 1,
        "tokens": [
            {"name": "a", "role": "admin", "sha256": h},
            {"name": "b", "role": "reader", "sha256": h},
        ],
    }
    (d / "tokens.json").write_text(json.dumps(doc))
    with pytest.raises(SecretsError, match="twice"):
        ensure_secrets(d)


def test_errors_survive_pickling(tmp_path: Path) -> None:
    err = InsecureSecretsError("too open", path=tmp_path / "x")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is InsecureSecretsError
    assert (str(copy), copy.path) == ("too open", tmp_path / "x")


def test_token_file_content_is_checked(tmp_path: Path) -> None:
    p = tmp_path / "t.token"
    p.write_text("two words-that-are-long-enough\n")
    os.chmod(p, 0o600)
    with pytest.raises(SecretsError, match="does not hold a token"):
        read_token_file(p)
    with pytest.raises(SecretsError, match="does not exist"):
        read_token_file(tmp_path / "missing.token")


# ---- racing creators -------------------------------------------------------------------------


def _race(args: tuple[str, float]) -> tuple[bytes, tuple[tuple[str, str, str], ...], str]:
    directory, start_at = args
    time.sleep(max(0.0, start_at - time.time()))
    s = ensure_secrets(Path(directory))
    tokens = tuple((t.name, t.role.wire_name, t.sha256) for t in s.tokens)
    admin = read_token_file(s.token_file(Role.ADMIN))
    return s.cluster_secret, tokens, admin


def test_processes_racing_on_first_use_agree(tmp_path: Path) -> None:
    workers = 6
    rounds = 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.map(time.sleep, [0] * workers)  # warm up: every worker has started
        for r in range(rounds):
            d = tmp_path / f"round{r}" / "secrets"
            start_at = time.time() + 0.2
            # A bounded wait: a worker that fails to report must fail the test, not hang it.
            results = pool.map_async(_race, [(str(d), start_at)] * workers).get(timeout=30)
            assert len(set(results)) == 1, results
            secret, tokens, admin = results[0]
            final = ensure_secrets(d)
            assert final.cluster_secret == secret
            assert tuple((t.name, t.role.wire_name, t.sha256) for t in final.tokens) == tokens
            assert final.role_for(admin) is Role.ADMIN
            # No temporary files are left behind by the losers.
            assert sorted(p.name for p in d.iterdir()) == [
                "admin.token",
                "cluster.secret",
                "reader.token",
                "tokens.json",
                "writer.token",
            ]


def test_no_secret_in_a_repr(tmp_path: Path) -> None:
    """A repr ends up in tracebacks, debuggers and test reports: the peer secret must not be
    in the one of Secrets, nor of raft's NodeConfig."""
    from raft.node import NodeConfig

    secrets = ensure_secrets(tmp_path / "s")
    assert secrets.cluster_secret.decode() not in repr(secrets)
    config = NodeConfig(
        node_id=1,
        cluster_id="c",
        data_dir=tmp_path / "d",
        listen_host="127.0.0.1",
        listen_port=1,
        peers={1: ("127.0.0.1", 1)},
        secret=secrets.cluster_secret,
    )
    assert secrets.cluster_secret.decode() not in repr(config)


@pytest.mark.parametrize("file", ["cluster.secret", "admin.token", "tokens.json"])
def test_a_disk_that_fills_while_a_secret_is_written_leaves_no_truncated_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str
) -> None:
    """A disk that fills mid-write: write() stores what fits and returns that count; the next
    call raises ENOSPC. The short count was ignored, so the first bytes of the secret were
    linked into place for good: the next start (disk freed) refused 'secret has N bytes', or
    took a truncated token. Now the file is not created, and the error names it."""
    d = tmp_path / "secrets"
    real_write = os.write
    fitted: list[int] = []

    def filling_write(fd: int, data: bytes) -> int:
        if f".{file}." not in os.readlink(f"/proc/self/fd/{fd}"):
            return real_write(fd, data)
        if not fitted:  # what still fits
            fitted.append(real_write(fd, bytes(data)[:5]))
            return fitted[0]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("metastore.daemon.secrets.os.write", filling_write)
    with pytest.raises(OSError) as caught:
        ensure_secrets(d)
    assert caught.value.filename == str(d / file)
    assert not (d / file).exists()
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    s = ensure_secrets(d)  # the disk has room again: created whole
    assert len(s.cluster_secret) >= 32
    assert len(read_token_file(d / "admin.token")) > 5
