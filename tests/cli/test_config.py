"""metastore.daemon.config: the committed configs load, rendering round-trips, and every kind of
bad input is refused with a ConfigError naming the file and the key."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metastore.daemon.config import (
    NODES_MAX,
    ConfigError,
    NodeAddress,
    load_cluster_config,
    load_node_config,
    node_layout,
    render_cluster_toml,
    render_node_toml,
)

REPO = Path(__file__).resolve().parents[2]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def to_toml(doc: dict[str, Any]) -> str:
    """A tiny TOML writer for test documents: scalars first, then [[nodes]] tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items() if k != "nodes"]
    nodes = doc.get("nodes")
    if isinstance(nodes, list) and all(isinstance(n, dict) for n in nodes) and nodes:
        for n in nodes:
            lines += ["", "[[nodes]]"] + [f"{k} = {toml_value(v)}" for k, v in n.items()]
    elif "nodes" in doc:
        lines.append(f"nodes = {toml_value(nodes)}")
    return "\n".join(lines) + "\n"


def base_doc() -> dict[str, Any]:
    return {
        "cluster_id": "test",
        "nodes": [
            {
                "id": i,
                "host": "127.0.0.1",
                "raft_port": 100 + i,
                "client_port": 200 + i,
                "metrics_port": 300 + i,
            }
            for i in (1, 2, 3)
        ],
    }


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(to_toml(doc))
    return path


# ---- what loads ------------------------------------------------------------------------------


def test_committed_local_config_loads_with_the_documented_ports() -> None:
    cfg = load_cluster_config(REPO / "cluster_configs/local/cluster.toml")
    assert cfg.cluster_id == "local"
    assert [(n.id, n.host, n.raft_port, n.client_port, n.metrics_port) for n in cfg.nodes] == [
        (1, "127.0.0.1", 24101, 24201, 24301),
        (2, "127.0.0.1", 24102, 24202, 24302),
        (3, "127.0.0.1", 24103, 24203, 24303),
    ]
    assert cfg.client_endpoints() == ["127.0.0.1:24201", "127.0.0.1:24202", "127.0.0.1:24203"]
    assert cfg.secrets_dir == REPO / "cluster_configs/local/secrets"
    assert cfg.data_dir == REPO / "cluster_configs/local/data"
    for i in (1, 2, 3):
        settings = load_node_config(REPO / f"cluster_configs/local/node{i}.toml")
        assert settings.node_id == i
        assert settings.data_dir == REPO / f"cluster_configs/local/data/node-{i}"
        assert settings.log_file == settings.data_dir / "node.log"
        assert [p.id for p in settings.peers] == [n for n in (1, 2, 3) if n != i]


def test_production_example_loads() -> None:
    cfg = load_cluster_config(REPO / "cluster_configs/production-example/cluster.toml")
    assert len({n.host for n in cfg.nodes}) == 3
    assert cfg.secrets_dir == Path("/etc/metastore/secrets")
    assert cfg.data_dir == Path("/var/lib/metastore")
    assert cfg.cs_max_ms <= cfg.dd_ms
    settings = load_node_config(REPO / "cluster_configs/production-example/node2.toml")
    assert settings.node.host == "metastore-2.example.internal"


def test_production_example_puts_table_data_on_storage_every_host_shares() -> None:
    """Without a `warehouse` key, tables land in `warehouse` next to cluster.toml: on each
    host's own disk under /etc/metastore, where no Spark executor and no other leader sees
    them. The example names shared storage, and says what the key is."""
    example = REPO / "cluster_configs/production-example/cluster.toml"
    cfg = load_cluster_config(example)
    assert not cfg.warehouse.startswith(str(example.parent))
    assert "\nwarehouse = " in example.read_text()


def test_production_example_names_the_bridges_real_tls_argument() -> None:
    text = (REPO / "cluster_configs/production-example/cluster.toml").read_text()
    assert "tls_ca_file" not in text  # MetastoreBridge has no such argument
    assert "ClientTls(ca_file=" in text


def test_defaults(tmp_path: Path) -> None:
    cfg = load_cluster_config(write(tmp_path / "cluster.toml", base_doc()))
    assert (cfg.dd_ms, cfg.cs_max_ms, cfg.idle_safe_time_interval_ms) == (500, 500, 250)
    assert (cfg.election_timeout_ms, cfg.heartbeat_interval_ms, cfg.tick_ms) == (300, 50, 10)
    assert cfg.snapshot_every_entries == 10_000
    assert cfg.log_level == "INFO"
    assert cfg.secrets_dir == tmp_path / "secrets"
    assert cfg.data_dir == tmp_path / "data"


def test_paths_are_relative_to_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "elsewhere").mkdir()
    doc = base_doc() | {"data_dir": "../state", "secrets_dir": "/abs/secrets"}
    write(tmp_path / "conf/cluster.toml", doc)
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = load_cluster_config(Path("../conf/cluster.toml"))
    assert cfg.data_dir.resolve() == (tmp_path / "state").resolve()
    assert cfg.secrets_dir == Path("/abs/secrets")
    assert cfg.path.is_absolute()


def test_render_round_trips(tmp_path: Path) -> None:
    layout = node_layout(5, host="10.0.0.7", base_port=30000)
    text = render_cluster_toml(cluster_id="c-1", nodes=layout, dd_ms=800, cs_max_ms=300)
    cfg = load_cluster_config(write_text(tmp_path / "cluster.toml", text))
    assert cfg.nodes == layout
    assert (cfg.dd_ms, cfg.cs_max_ms) == (800, 300)
    write_text(tmp_path / "node4.toml", render_node_toml(4))
    settings = load_node_config(tmp_path / "node4.toml")
    assert settings.node == layout[3]
    assert settings.node.raft_address == "10.0.0.7:30004"
    assert settings.node.client_address == "10.0.0.7:30104"
    assert settings.node.metrics_address == "10.0.0.7:30204"


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_cluster_file_plus_node_id(tmp_path: Path) -> None:
    path = write(tmp_path / "cluster.toml", base_doc())
    assert load_node_config(path, 2).node_id == 2


def test_node_file_with_matching_node_id(tmp_path: Path) -> None:
    write(tmp_path / "cluster.toml", base_doc())
    write_text(tmp_path / "node1.toml", render_node_toml(1))
    assert load_node_config(tmp_path / "node1.toml", 1).node_id == 1


def test_same_ports_on_different_hosts_are_fine(tmp_path: Path) -> None:
    doc = base_doc()
    for i, n in enumerate(doc["nodes"]):
        n.update(host=f"h{i}", raft_port=7000, client_port=7001, metrics_port=7002)
    assert len(load_cluster_config(write(tmp_path / "c.toml", doc)).nodes) == 3


def test_ipv6_host_addresses_are_bracketed() -> None:
    n = NodeAddress(id=1, host="::1", raft_port=1, client_port=2, metrics_port=3)
    assert n.client_address == "[::1]:2"


def test_node_layout_limits() -> None:
    with pytest.raises(ValueError, match="node count"):
        node_layout(NODES_MAX + 1, host="h", base_port=1000)
    with pytest.raises(ValueError, match="base port"):
        node_layout(3, host="h", base_port=65_400)


# ---- what is refused: (mutation of the base document, offending key, words in the problem) --

Mutation = Callable[[dict[str, Any]], None]


def set_key(key: str, value: Any) -> Mutation:
    return lambda d: d.__setitem__(key, value)


def set_node(index: int, key: str, value: Any) -> Mutation:
    return lambda d: d["nodes"][index].__setitem__(key, value)


def drop_key(key: str) -> Mutation:
    return lambda d: d.pop(key)


def drop_node_key(index: int, key: str) -> Mutation:
    return lambda d: d["nodes"][index].pop(key)


def both(*mutations: Mutation) -> Mutation:
    def apply(d: dict[str, Any]) -> None:
        for m in mutations:
            m(d)

    return apply


def extra_nodes(count: int) -> Mutation:
    def apply(d: dict[str, Any]) -> None:
        d["nodes"] = [
            {
                "id": i,
                "host": "h",
                "raft_port": 1000 + i,
                "client_port": 2000 + i,
                "metrics_port": 3000 + i,
            }
            for i in range(1, count + 1)
        ]

    return apply


BAD: list[tuple[str, Mutation, str, str]] = [
    ("missing cluster_id", drop_key("cluster_id"), "cluster_id", "required"),
    ("empty cluster_id", set_key("cluster_id", " "), "cluster_id", "empty"),
    ("cluster_id chars", set_key("cluster_id", "a b"), "cluster_id", "letters"),
    ("cluster_id length", set_key("cluster_id", "x" * 129), "cluster_id", "longer"),
    ("cluster_id type", set_key("cluster_id", 5), "cluster_id", "string"),
    ("typo", set_key("heartbeat_interval", 50), "heartbeat_interval", "unknown key"),
    ("unknown node key", set_node(1, "port", 5), "nodes[1].port", "unknown key"),
    ("dd_ms string", set_key("dd_ms", "500"), "dd_ms", "integer"),
    ("dd_ms bool", set_key("dd_ms", True), "dd_ms", "integer"),
    ("dd_ms zero", set_key("dd_ms", 0), "dd_ms", "below the minimum 1"),
    ("dd_ms huge", set_key("dd_ms", 60_001), "dd_ms", "above the maximum"),
    ("cs_max negative", set_key("cs_max_ms", -1), "cs_max_ms", "below"),
    (
        "cs_max > dd",
        both(
            set_key("dd_ms", 400),
            set_key("cs_max_ms", 401),
            set_key("idle_safe_time_interval_ms", 100),
        ),
        "cs_max_ms",
        "DD must cover",
    ),
    ("tick zero", set_key("tick_ms", 0), "tick_ms", "below"),
    ("tick huge", set_key("tick_ms", 1001), "tick_ms", "above"),
    ("heartbeat < tick", set_key("heartbeat_interval_ms", 5), "heartbeat_interval_ms", "tick_ms"),
    ("heartbeat huge", set_key("heartbeat_interval_ms", 10_001), "heartbeat_interval_ms", "above"),
    (
        "election < 2 heartbeats",
        set_key("election_timeout_ms", 99),
        "election_timeout_ms",
        "heartbeat",
    ),
    ("election huge", set_key("election_timeout_ms", 60_001), "election_timeout_ms", "above"),
    (
        "idle < tick",
        set_key("idle_safe_time_interval_ms", 5),
        "idle_safe_time_interval_ms",
        "tick_ms",
    ),
    (
        "idle > dd",
        set_key("idle_safe_time_interval_ms", 501),
        "idle_safe_time_interval_ms",
        "dd_ms",
    ),
    ("snapshot small", set_key("snapshot_every_entries", 99), "snapshot_every_entries", "below"),
    ("snapshot huge", set_key("snapshot_every_entries", 10**8), "snapshot_every_entries", "above"),
    ("log level", set_key("log_level", "LOUD"), "log_level", "not one of"),
    ("empty data_dir", set_key("data_dir", ""), "data_dir", "empty"),
    (
        "data = secrets",
        both(set_key("data_dir", "x"), set_key("secrets_dir", "x")),
        "data_dir",
        "differ",
    ),
    ("no nodes key", drop_key("nodes"), "nodes", "required"),
    ("nodes not tables", set_key("nodes", [1, 2]), "nodes", "array of tables"),
    ("nodes empty", set_key("nodes", []), "nodes", "0 [[nodes]]"),
    ("too many nodes", extra_nodes(NODES_MAX + 1), "nodes", "NODES_MAX"),
    ("node id zero", set_node(0, "id", 0), "nodes[0].id", "below"),
    ("node id negative", set_node(0, "id", -3), "nodes[0].id", "below"),
    ("node id huge", set_node(0, "id", 10**9), "nodes[0].id", "above"),
    ("node id bool", set_node(0, "id", True), "nodes[0].id", "integer"),
    ("node id missing", drop_node_key(0, "id"), "nodes[0].id", "required"),
    ("duplicate id", set_node(2, "id", 1), "nodes[2].id", "already used by nodes[0].id"),
    ("empty host", set_node(1, "host", ""), "nodes[1].host", "empty"),
    ("bad host", set_node(1, "host", "a host"), "nodes[1].host", "hostname"),
    # A colon makes it an IPv6 address (bracketed in every address): it must be one.
    ("colon host", set_node(1, "host", "db:7000"), "nodes[1].host", "IPv6"),
    ("bad ipv6 host", set_node(1, "host", "fe80:::1"), "nodes[1].host", "IPv6"),
    ("port zero", set_node(0, "raft_port", 0), "nodes[0].raft_port", "below"),
    ("port huge", set_node(0, "client_port", 65_536), "nodes[0].client_port", "above"),
    ("port string", set_node(0, "metrics_port", "80"), "nodes[0].metrics_port", "integer"),
    ("port missing", drop_node_key(0, "metrics_port"), "nodes[0].metrics_port", "required"),
    (
        "ports clash in a node",
        set_node(0, "client_port", 101),
        "nodes[0].client_port",
        "already used by nodes[0].raft_port",
    ),
    (
        "ports clash across nodes",
        set_node(1, "raft_port", 201),
        "nodes[1].raft_port",
        "already used by nodes[0].client_port",
    ),
    # `localhost` is the loopback address: the same listener as 127.0.0.1 (or ::1).
    (
        "localhost clashes with 127.0.0.1",
        both(set_node(1, "host", "localhost"), set_node(1, "raft_port", 101)),
        "nodes[1].raft_port",
        "already used by nodes[0].raft_port",
    ),
    (
        "LOCALHOST. clashes with 127.0.0.1",
        both(set_node(1, "host", "LOCALHOST."), set_node(1, "client_port", 201)),
        "nodes[1].client_port",
        "already used by nodes[0].client_port",
    ),
    (
        "localhost clashes with ::1",
        both(
            set_node(0, "host", "::1"),
            set_node(1, "host", "localhost"),
            set_node(1, "metrics_port", 301),
        ),
        "nodes[1].metrics_port",
        "already used by nodes[0].metrics_port",
    ),
    (
        "an IPv6 spelling of the same address clashes",
        both(
            set_node(0, "host", "::1"),
            set_node(1, "host", "0:0:0:0:0:0:0:1"),
            set_node(1, "raft_port", 101),
        ),
        "nodes[1].raft_port",
        "already used by nodes[0].raft_port",
    ),
    # Separate hosts have separate clocks: CSmax 0 makes a follower whose clock is 1 ms behind
    # the leader's drop every entry.
    (
        "cs_max 0 on separate hosts",
        both(*(set_node(i, "host", f"db{i}") for i in range(3)), set_key("cs_max_ms", 0)),
        "cs_max_ms",
        "separate hosts",
    ),
    (
        "cs_max below NTP accuracy on separate hosts",
        both(*(set_node(i, "host", f"db{i}") for i in range(3)), set_key("cs_max_ms", 9)),
        "cs_max_ms",
        "separate hosts",
    ),
    # A session must outlive a leader change, or every election expires the sessions (and
    # with them the leases of running jobs).
    (
        "session ttl shorter than a leader change",
        both(set_key("election_timeout_ms", 2_000), set_key("session_ttl_ms", 5_000)),
        "session_ttl_ms",
        "election_timeout_ms",
    ),
    (
        "session ttl shorter than a leader change plus a session heartbeat",
        both(
            set_key("election_timeout_ms", 1_000),
            set_key("session_ttl_ms", 3_600),
            set_key("session_heartbeat_ms", 1_000),
        ),
        "session_ttl_ms",
        "session_heartbeat_ms",
    ),
]


@pytest.mark.parametrize(("mutate", "key", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_cluster_files_are_refused(
    tmp_path: Path, mutate: Mutation, key: str, words: str
) -> None:
    doc = copy.deepcopy(base_doc())
    mutate(doc)
    path = write(tmp_path / "cluster.toml", doc)
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    err = info.value
    assert err.path == path
    assert err.key == key
    assert words in err.problem
    assert str(err).startswith(f"{path}: {key}: ")
    assert err.code == "CONFIG_INVALID"


def test_cs_max_zero_is_accepted_when_every_node_shares_one_clock(tmp_path: Path) -> None:
    doc = base_doc()
    doc["cs_max_ms"] = 0
    doc["nodes"][1]["host"] = "localhost"  # the same machine as 127.0.0.1
    assert load_cluster_config(write(tmp_path / "cluster.toml", doc)).cs_max_ms == 0


def test_cs_max_at_the_separate_host_minimum_is_accepted(tmp_path: Path) -> None:
    doc = base_doc()
    for i, node in enumerate(doc["nodes"]):
        node["host"] = f"db{i}"
    doc["cs_max_ms"] = 10
    assert load_cluster_config(write(tmp_path / "cluster.toml", doc)).cs_max_ms == 10


def test_session_ttl_at_the_leader_change_bound_is_accepted(tmp_path: Path) -> None:
    doc = base_doc()
    doc.update(election_timeout_ms=1_000, session_ttl_ms=4_000, session_heartbeat_ms=1_000)
    assert load_cluster_config(write(tmp_path / "cluster.toml", doc)).session_ttl_ms == 4_000


def test_config_error_survives_pickling(tmp_path: Path) -> None:
    err = ConfigError(path=tmp_path / "c.toml", key="dd_ms", problem="too big")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.key, copy.problem, str(copy)) == (
        err.path,
        "dd_ms",
        "too big",
        str(err),
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as info:
        load_cluster_config(tmp_path / "nope.toml")
    assert info.value.key is None


def test_not_toml(tmp_path: Path) -> None:
    path = write_text(tmp_path / "c.toml", "cluster_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_cluster_config(path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(b'cluster_id = "\xff"\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load_cluster_config(path)


def test_oversized_file(tmp_path: Path) -> None:
    path = write_text(tmp_path / "c.toml", "# " + "x" * 300_000 + "\n")
    with pytest.raises(ConfigError, match="CONFIG_FILE_BYTES_MAX"):
        load_cluster_config(path)


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_cluster_config(tmp_path)


# ---- node files ------------------------------------------------------------------------------


def node_file(tmp_path: Path, text: str) -> Path:
    write(tmp_path / "cluster.toml", base_doc())
    return write_text(tmp_path / "node.toml", text)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('cluster = "cluster.toml"\nnode_id = 9\n', "nodes", "node 9 is not a member"),
        ('cluster = "cluster.toml"\n', "node_id", "required"),
        ("node_id = 1\n", "cluster", "required"),
        ('cluster = "cluster.toml"\nnode_id = "1"\n', "node_id", "integer"),
        ('cluster = "cluster.toml"\nnode_id = 1\nhost = "x"\n', "host", "unknown key"),
        ('cluster = "missing.toml"\nnode_id = 1\n', None, "file not found"),
        ('cluster = "node.toml"\nnode_id = 1\n', "cluster", "cannot name itself"),
        ("cluster = 3\nnode_id = 1\n", "cluster", "string"),
    ],
)
def test_invalid_node_files_are_refused(
    tmp_path: Path, text: str, key: str | None, words: str
) -> None:
    path = node_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    assert info.value.key == key
    assert words in info.value.problem


def test_node_id_argument_must_match_the_node_file(tmp_path: Path) -> None:
    path = node_file(tmp_path, 'cluster = "cluster.toml"\nnode_id = 1\n')
    with pytest.raises(ConfigError, match="node 1 but node 2 was asked for"):
        load_node_config(path, 2)


def test_cluster_file_needs_a_node_id(tmp_path: Path) -> None:
    path = write(tmp_path / "cluster.toml", base_doc())
    with pytest.raises(ConfigError, match="--node-id"):
        load_node_config(path)
    with pytest.raises(ConfigError, match="not a member"):
        load_node_config(path, 7)


def test_node_file_is_not_a_cluster_file(tmp_path: Path) -> None:
    path = node_file(tmp_path, 'cluster = "cluster.toml"\nnode_id = 1\n')
    with pytest.raises(ConfigError, match="node file"):
        load_cluster_config(path)


def test_errors_in_the_referenced_cluster_file_name_that_file(tmp_path: Path) -> None:
    doc = base_doc() | {"tick_ms": 0}
    write(tmp_path / "cluster.toml", doc)
    path = write_text(tmp_path / "n.toml", 'cluster = "cluster.toml"\nnode_id = 1\n')
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    assert info.value.path == tmp_path / "cluster.toml"
    assert info.value.key == "tick_ms"


# ---- path values that cannot name a file -----------------------------------------------------

# A NUL (TOML's "\u0000") cannot be in a path, and `~name` for a user this host does not know
# cannot be expanded: both used to escape the loader as a ValueError or RuntimeError traceback
# (at load, or later when a node opened the path) instead of a ConfigError naming the key.
BAD_PATH_LINES: list[tuple[str, str, str, str]] = [
    ("nul data_dir", 'data_dir = "data\\u0000x"', "data_dir", "NUL"),
    ("nul secrets_dir", 'secrets_dir = "s\\u0000"', "secrets_dir", "NUL"),
    ("nul warehouse", 'warehouse = "w\\u0000"', "warehouse", "NUL"),
    ("unknown user data_dir", 'data_dir = "~no-such-user-x9/data"', "data_dir", "~no-such-user-x9"),
    ("unknown user warehouse", 'warehouse = "~no-such-user-x9/w"', "warehouse", "~no-such-user-x9"),
    ("control char data_dir", 'data_dir = "a\\nb"', "data_dir", "control character"),
]


@pytest.mark.parametrize(
    ("line", "key", "words"), [b[1:] for b in BAD_PATH_LINES], ids=[b[0] for b in BAD_PATH_LINES]
)
def test_paths_that_cannot_name_a_file_are_refused(
    tmp_path: Path, line: str, key: str, words: str
) -> None:
    path = write_text(tmp_path / "cluster.toml", line + "\n" + to_toml(base_doc()))
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    assert info.value.key == key
    assert words in info.value.problem


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('ca_file = "ca\\u0000"\ncert_file = "c"\nkey_file = "k"', "tls.ca_file"),
        ('ca_file = "~no-such-user-x9/ca"\ncert_file = "c"\nkey_file = "k"', "tls.ca_file"),
        ('ca_file = "ca"\ncert_file = "c\\u0000"\nkey_file = "k"', "tls.cert_file"),
        ('ca_file = "ca"\ncert_file = "c"\nkey_file = "~no-such-user-x9/k"', "tls.key_file"),
    ],
)
def test_tls_paths_that_cannot_name_a_file_are_refused(
    tmp_path: Path, table: str, key: str
) -> None:
    path = write_text(tmp_path / "cluster.toml", to_toml(base_doc()) + "\n[tls]\n" + table + "\n")
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    assert info.value.key == key


@pytest.mark.parametrize(
    "ref", ["cluster\\u0000.toml", "~no-such-user-x9/cluster.toml"], ids=["nul", "unknown user"]
)
def test_a_node_file_naming_an_impossible_cluster_path_is_refused(tmp_path: Path, ref: str) -> None:
    path = node_file(tmp_path, f'cluster = "{ref}"\nnode_id = 1\n')
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    assert info.value.key == "cluster"


# ---- allowed_locations (metastore/daemon/allowed_locations.py) -------------------------------


def test_allowed_locations_default_to_the_warehouse_only(tmp_path: Path) -> None:
    cfg = load_cluster_config(write(tmp_path / "cluster.toml", base_doc()))
    assert cfg.allowed_locations == ()
    roots = cfg.location_roots()
    assert roots.describe() == [str((tmp_path / "warehouse").resolve())]
    assert not roots.allows("/home/someone/important")


def test_allowed_locations_resolve_like_the_warehouse(tmp_path: Path) -> None:
    doc = base_doc() | {"allowed_locations": ["external/", "/abs/ext", "s3a://Bucket/ext/"]}
    cfg = load_cluster_config(write(tmp_path / "cluster.toml", doc))
    external = str((tmp_path / "external").resolve())
    assert cfg.allowed_locations == (external, "/abs/ext", "s3a://Bucket/ext")
    assert cfg.location_roots().allows("s3://bucket/ext/t")
    star = load_cluster_config(
        write(tmp_path / "star.toml", base_doc() | {"allowed_locations": ["*"]})
    )
    assert star.location_roots().anywhere


@pytest.mark.parametrize(
    ("value", "key", "words"),
    [
        ('"/data"', "allowed_locations", "array of strings"),
        ('["*", "/data"]', "allowed_locations", "nothing else"),
        ('["/"]', "allowed_locations[0]", '"*"'),
        ('["file:///"]', "allowed_locations[0]", '"*"'),
        ('["/ok", ""]', "allowed_locations[1]", "empty"),
        ('["s3a://b/x?endpoint_override=evil"]', "allowed_locations[0]", "query"),
        ('["file://host/x"]', "allowed_locations[0]", "no host"),
        ('["/a\\u0000"]', "allowed_locations[0]", "NUL"),
        ("[" + ", ".join(f'"/r{i}"' for i in range(65)) + "]", "allowed_locations", "at most 64"),
    ],
)
def test_bad_allowed_locations_are_refused(
    tmp_path: Path, value: str, key: str, words: str
) -> None:
    path = write_text(
        tmp_path / "cluster.toml", f"allowed_locations = {value}\n" + to_toml(base_doc())
    )
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    assert info.value.key == key
    assert words in info.value.problem


def test_committed_configs_say_where_tables_may_live() -> None:
    local = load_cluster_config(REPO / "cluster_configs/local/cluster.toml")
    assert local.allowed_locations == ()
    assert local.location_roots().describe() == [str(REPO / "cluster_configs/local/warehouse")]
    prod = load_cluster_config(REPO / "cluster_configs/production-example/cluster.toml")
    assert prod.warehouse == "/mnt/warehouse"  # a shared mount (see its comment)
    assert prod.allowed_locations and "*" not in prod.allowed_locations
