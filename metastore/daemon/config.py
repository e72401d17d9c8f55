"""Cluster and node configuration: TOML files in, frozen and fully validated settings out.

Two kinds of file (see `cluster_configs/` for examples):

* `cluster.toml` describes the whole cluster and is identical on every host: the cluster id,
  the IEP-98 timing (DD, CSmax), the Raft timing, where secrets and data live, and one
  `[[nodes]]` table per initial member with its id, host and three ports (Raft peers, clients,
  Prometheus metrics).
  An optional `[tls]` table turns on mutual TLS between peers and TLS on the client port
  (`TlsSettings`); `{node_id}` in its certificate and key paths keeps the file identical on
  every host.
* `nodeN.toml` says which member this process is: `cluster = "cluster.toml"` (relative to the
  node file) and `node_id = N`. Nothing else, so a node can never disagree with the cluster file.

`load_node_config(path, node_id=None)` accepts either kind: a node file, or a cluster file plus a
node id (what `metastore node start --config cluster.toml --node-id 2` passes).

Invariants
    * A loaded config is valid as a whole: every value is type- and range-checked, the ids are
      distinct, no two listeners share a (host, port) (localhost is 127.0.0.1 and ::1), and the
      durations fit together (a heartbeat is shorter than an election timeout, safe time ticks
      within DD, CSmax <= DD, CSmax >= CS_MAX_MS_SEPARATE_HOSTS_MIN across hosts, a session
      outlives a leader change: SESSION_TTL_ELECTION_TIMEOUTS_MIN).
    * Unknown keys are errors. A typo ("heartbeat_interval" without `_ms`) must not silently
      fall back to a default on one node.
    * Every failure is a `ConfigError` naming the file, the key and what is wrong; nothing is
      started from a config that did not load.
    * Relative `secrets_dir` / `data_dir` are relative to the cluster file, never to the working
      directory, so every tool that reads the same file finds the same directories.
    * Loading reads the files and nothing else: no directory is created here.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

from metastore import limits as mlimits
from metastore.daemon import api_limits
from metastore.daemon.allowed_locations import ANY_LOCATION, AllowedLocations
from metastore.limits import MAX_CLOCK_SKEW_MS, MAX_DELAY_DURATION_MS
from raft.tls import TlsFiles

__all__ = [
    "CLUSTER_FILE_NAME",
    "ClusterConfig",
    "ConfigError",
    "DEFAULT_BASE_PORT",
    "NodeAddress",
    "NodeSettings",
    "TlsSettings",
    "load_cluster_config",
    "load_node_config",
    "node_file_name",
    "node_layout",
    "render_cluster_toml",
    "render_node_toml",
]

# ---- limits ----------------------------------------------------------------------------------
# Named here because they bound this file format only; the engine's own limits live in
# `raft.limits` and `metastore.limits`.

# Raft needs an odd number of voters to be useful; beyond 7 every write waits for 4+ fsyncs on
# other hosts and nobody runs a metastore that wide.
NODES_MIN: Final = 1
NODES_MAX: Final = 7
# Node ids are chosen by operators and shown everywhere; a small number keeps them readable.
NODE_ID_MAX: Final = 1_000_000
PORT_MIN: Final = 1
PORT_MAX: Final = 65_535
# DNS names are at most 253 characters.
HOST_CHARS_MAX: Final = 253
# Must fit the peer handshake frame (`raft.limits.CLUSTER_ID_CHARS_MAX` is 128).
CLUSTER_ID_CHARS_MAX: Final = 128
# A config file is a few hundred bytes; refuse to parse something that is clearly not one.
CONFIG_FILE_BYTES_MAX: Final = 256 * 1024
PATH_CHARS_MAX: Final = 4096

# A tick below 1 ms is just a busy loop; above 1 s elections and heartbeats get too coarse.
TICK_MS_MIN: Final = 1
TICK_MS_MAX: Final = 1_000
HEARTBEAT_INTERVAL_MS_MAX: Final = 10_000
ELECTION_TIMEOUT_MS_MAX: Final = 60_000
# A follower must miss at least two heartbeats before it may call an election, or a single
# late packet deposes a healthy leader.
ELECTION_TO_HEARTBEAT_RATIO_MIN: Final = 2
SNAPSHOT_EVERY_ENTRIES_MIN: Final = 100
SNAPSHOT_EVERY_ENTRIES_MAX: Final = 10_000_000
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# ---- defaults (DESIGN.md §3: Ignite's DD and CSmax, 250 ms idle safe-time ticks) -------------

DEFAULT_DD_MS: Final = 500
DEFAULT_CS_MAX_MS: Final = 500
DEFAULT_IDLE_SAFE_TIME_INTERVAL_MS: Final = 250
DEFAULT_ELECTION_TIMEOUT_MS: Final = 300
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 50
DEFAULT_TICK_MS: Final = 10
DEFAULT_SNAPSHOT_EVERY_ENTRIES: Final = 10_000
DEFAULT_SECRETS_DIR: Final = "secrets"
DEFAULT_DATA_DIR: Final = "data"
# Root of table locations: CREATE TABLE without LOCATION puts a table at <warehouse>/<ns>.db/<t>.
DEFAULT_WAREHOUSE: Final = "warehouse"
# Roots of table locations besides the warehouse (metastore/daemon/allowed_locations.py): none
# by default, so CREATE TABLE ... LOCATION must name a directory inside the warehouse; ["*"]
# allows any location (the behaviour before the setting existed).
DEFAULT_ALLOWED_LOCATIONS: Final[tuple[str, ...]] = ()
# An operator lists a few external roots; hundreds would be a mistake (each is compared with
# every new location and every file the GC deletes).
ALLOWED_LOCATIONS_MAX: Final = 64
DEFAULT_LOG_LEVEL: Final = "INFO"

# Port layout of `node_layout`: node N listens on base+N (Raft), base+100+N (clients) and
# base+200+N (metrics); with NODES_MAX <= 99 the three ranges never overlap.
DEFAULT_BASE_PORT: Final = 24_100
CLIENT_PORT_OFFSET: Final = 100
METRICS_PORT_OFFSET: Final = 200

# Clients heartbeat at least this far apart (each heartbeat is a Raft entry).
SESSION_HEARTBEAT_MS_MIN: Final = 100
# A session must outlive a leader change, or each election expires the sessions (and the leases
# of every running job) whose heartbeat fell into it. A follower calls an election after a
# randomized 1 to 2 election timeouts without its leader (raft.core: `randomized_election_ticks`);
# the third covers the vote round and the client finding the new leader. On top comes the
# client's own interval: its heartbeat just before the leader went is the last one that counted.
SESSION_TTL_ELECTION_TIMEOUTS_MIN: Final = 3
# Nodes on separate hosts read separate clocks: a follower whose clock trails the leader's by
# more than CSmax drops its entries (the HLC's accepted offset). NTP keeps hosts on one network
# within about a millisecond, and hosts synced over the internet within tens of ms, so a CSmax
# below this is a setting no real deployment keeps. Nodes that share one host (one clock) may
# use any CSmax, 0 included.
CS_MAX_MS_SEPARATE_HOSTS_MIN: Final = 10
# Names of this machine's loopback interface: the same listener as 127.0.0.1 / ::1.
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# GC schedule: every 10 minutes by default (CockroachDB's protected-timestamp poll interval is
# of that order); as often as every 100 ms for tests and demos.
DEFAULT_SNAPSHOT_KEEP_ENTRIES: Final = 1_000
GC_INTERVAL_MS_DEFAULT: Final = 600_000
GC_INTERVAL_MS_MIN: Final = 100
GC_INTERVAL_MS_MAX: Final = 86_400_000
# An unreferenced file younger than this may belong to a batch that has not committed yet.
GC_ORPHAN_GRACE_MS_DEFAULT: Final = 3_600_000
GC_ORPHAN_GRACE_MS_MIN: Final = 1_000
GC_ORPHAN_GRACE_MS_MAX: Final = 30 * 86_400_000
# Deletions per second, so a GC after a mass overwrite does not saturate the file system.
GC_DELETE_FILES_PER_S_DEFAULT: Final = 1_000
CLIENT_CONNECTIONS_MAX_DEFAULT: Final = api_limits.CLIENT_CONNECTIONS_MAX
CLIENT_CONNECTIONS_MAX_MIN: Final = 8
CLIENT_CONNECTIONS_MAX_MAX: Final = 65_536
GC_DELETE_FILES_PER_S_MAX: Final = 100_000
READ_STALENESS_MAX_MS_DEFAULT: Final = api_limits.READ_STALENESS_MAX_MS_DEFAULT
READ_STALENESS_MAX_MS_MAX: Final = 600_000

CLUSTER_FILE_NAME: Final = "cluster.toml"
NODE_LOG_FILE_NAME: Final = "node.log"
NODE_PID_FILE_NAME: Final = "node.pid"

_CLUSTER_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Hostnames, IPv4 and (unbracketed) IPv6 literals.
_HOST_RE: Final = re.compile(r"[A-Za-z0-9._:-]+")

_CLUSTER_KEYS: Final = frozenset(
    {
        "cluster_id",
        "dd_ms",
        "cs_max_ms",
        "idle_safe_time_interval_ms",
        "election_timeout_ms",
        "heartbeat_interval_ms",
        "tick_ms",
        "snapshot_every_entries",
        "snapshot_keep_entries",
        "session_ttl_ms",
        "session_heartbeat_ms",
        "gc_interval_ms",
        "gc_orphan_grace_ms",
        "gc_delete_files_per_s",
        "client_connections_max",
        "loose_files_max",
        "read_staleness_max_ms",
        "secrets_dir",
        "data_dir",
        "warehouse",
        "allowed_locations",
        "log_level",
        "nodes",
        "tls",
    }
)
# The one placeholder of [tls] cert_file / key_file.
TLS_NODE_ID_PLACEHOLDER: Final = "{node_id}"


class ConfigError(Exception):
    """A configuration file is missing, unreadable or invalid.

    `path` is the file, `key` the offending key in dotted form (`nodes[1].client_port`, or None
    when the problem is the file as a whole) and `problem` says what is wrong in words.
    """

    code: ClassVar[str] = "CONFIG_INVALID"

    def __init__(self, *, path: Path, key: str | None, problem: str) -> None:
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.key = key
        self.problem = problem

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments: default exception pickling would lose them.
        return (_rebuild_config_error, (self.path, self.key, self.problem))


def _rebuild_config_error(path: Path, key: str | None, problem: str) -> ConfigError:
    return ConfigError(path=path, key=key, problem=problem)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAddress:
    """Where one member listens. Invariant: the three ports differ."""

    id: int
    host: str
    raft_port: int
    client_port: int
    metrics_port: int

    @property
    def raft_address(self) -> str:
        return _join_host_port(self.host, self.raft_port)

    @property
    def client_address(self) -> str:
        return _join_host_port(self.host, self.client_port)

    @property
    def metrics_address(self) -> str:
        return _join_host_port(self.host, self.metrics_port)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    """The `[tls]` table: which listeners use TLS and where the PEM files are.

    `cert_file` and `key_file` are absolute paths that may contain `{node_id}` (one file per
    node, the same cluster.toml everywhere). A node presents its certificate on both listeners
    and verifies peers (and, with `client_cert_required`, clients) against `ca_file`.
    Invariant: at least one of `peers` / `clients` is on; `client_cert_required` implies
    `clients`.
    """

    ca_file: Path
    cert_file: str
    key_file: str
    # Mutual TLS on Raft peer links (under the HMAC handshake with the cluster secret).
    peers: bool = True
    # TLS on the client port (CLI, Spark drivers, forwarding between nodes).
    clients: bool = True
    # Clients must present a certificate signed by ca_file (mutual TLS on the client port).
    client_cert_required: bool = False

    def node_files(self, node_id: int) -> TlsFiles:
        return TlsFiles(
            ca_file=self.ca_file,
            cert_file=Path(self.cert_file.replace(TLS_NODE_ID_PLACEHOLDER, str(node_id))),
            key_file=Path(self.key_file.replace(TLS_NODE_ID_PLACEHOLDER, str(node_id))),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """The validated content of a cluster.toml. Paths are absolute."""

    path: Path
    cluster_id: str
    dd_ms: int
    cs_max_ms: int
    idle_safe_time_interval_ms: int
    election_timeout_ms: int
    heartbeat_interval_ms: int
    tick_ms: int
    snapshot_every_entries: int
    secrets_dir: Path
    data_dir: Path
    log_level: str
    # An absolute path, or a URI (s3a://..., hdfs://...) Spark and pyarrow can write.
    warehouse: str
    # Invariant: ordered by id; ids distinct; (host, port) pairs distinct.
    nodes: tuple[NodeAddress, ...]
    # Sessions (metastore.leases): the TTL a session gets unless its client asks for another,
    # and the heartbeat interval clients are told to use.
    session_ttl_ms: int = mlimits.SESSION_TTL_MS_DEFAULT
    session_heartbeat_ms: int = mlimits.SESSION_HEARTBEAT_MS_DEFAULT
    # The GC (metastore/daemon/gc_worker.py): how often the leader runs it, how old an
    # unreferenced file must be before it is deleted as an orphan, and its deletion rate.
    # Entries a node keeps in memory behind its snapshot, so a follower a little behind catches
    # up from entries instead of a whole snapshot.
    snapshot_keep_entries: int = DEFAULT_SNAPSHOT_KEEP_ENTRIES
    gc_interval_ms: int = GC_INTERVAL_MS_DEFAULT
    gc_orphan_grace_ms: int = GC_ORPHAN_GRACE_MS_DEFAULT
    gc_delete_files_per_s: int = GC_DELETE_FILES_PER_S_DEFAULT
    # Client connections a node serves at once (strangers that have not authenticated are
    # closed, oldest first, to make room: metastore/daemon/server.py).
    client_connections_max: int = CLIENT_CONNECTIONS_MAX_DEFAULT
    # None: plain TCP everywhere (the local demo). See TlsSettings.
    tls: TlsSettings | None = None
    # Loose file entries a table may hold before writers (the bridge, the data source) move
    # older ones into manifest files (metastore.manifests); 0: never automatically. Clients
    # learn it from `compaction_view`.
    loose_files_max: int = mlimits.LOOSE_FILES_MAX_DEFAULT
    # See READ_STALENESS_MAX_MS_DEFAULT.
    read_staleness_max_ms: int = READ_STALENESS_MAX_MS_DEFAULT
    # Where table locations may lie besides the warehouse: absolute paths or URIs, no
    # trailing '/'; ("*",) allows any location. See `location_roots`.
    allowed_locations: tuple[str, ...] = DEFAULT_ALLOWED_LOCATIONS

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    def node(self, node_id: int) -> NodeAddress:
        """The member with this id; ConfigError naming the known ids if there is none."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(
            path=self.path,
            key="nodes",
            problem=f"no node with id {node_id} (known ids: {list(self.node_ids)})",
        )

    def location_roots(self) -> AllowedLocations:
        """The roots table locations may lie in: the warehouse and `allowed_locations`,
        enforced by the leader on CREATE TABLE and by the GC before deleting."""
        return AllowedLocations.of(warehouse=self.warehouse, extra=self.allowed_locations)

    def node_data_dir(self, node_id: int) -> Path:
        """`data_dir/node-<id>`: the node's WAL, snapshots, log file and pid file."""
        return self.data_dir / f"node-{node_id}"

    def node_log_file(self, node_id: int) -> Path:
        return self.node_data_dir(node_id) / NODE_LOG_FILE_NAME

    def node_pid_file(self, node_id: int) -> Path:
        return self.node_data_dir(node_id) / NODE_PID_FILE_NAME

    def client_endpoints(self) -> list[str]:
        """Every member's client address (`host:port`), in id order."""
        return [n.client_address for n in self.nodes]

    def raft_addresses(self) -> dict[int, tuple[str, int]]:
        """Every member's Raft address as the transport wants it."""
        return {n.id: (n.host, n.raft_port) for n in self.nodes}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """Everything one node process needs: the cluster and which member it is."""

    # The file the node was started with (a node file, or the cluster file with --node-id).
    config_path: Path
    cluster: ClusterConfig
    node: NodeAddress
    data_dir: Path
    log_file: Path
    pid_file: Path

    @property
    def node_id(self) -> int:
        return self.node.id

    @property
    def peer_tls(self) -> TlsFiles | None:
        """This node's TLS files for peer links, or None when peers speak plain TCP."""
        tls = self.cluster.tls
        return tls.node_files(self.node_id) if tls is not None and tls.peers else None

    @property
    def client_tls(self) -> TlsFiles | None:
        """This node's TLS files for its client port, or None when it is plain TCP."""
        tls = self.cluster.tls
        return tls.node_files(self.node_id) if tls is not None and tls.clients else None

    @property
    def peers(self) -> tuple[NodeAddress, ...]:
        """The other initial members."""
        return tuple(n for n in self.cluster.nodes if n.id != self.node.id)


# ---- loading ---------------------------------------------------------------------------------


def load_cluster_config(path: Path) -> ClusterConfig:
    """Read and validate a cluster.toml."""
    path = Path(path).absolute()
    data = _read_toml(path)
    if "cluster" in data or "node_id" in data:
        raise ConfigError(
            path=path,
            key=None,
            problem="this is a node file (it has 'cluster'/'node_id'); a cluster file was expected",
        )
    return _parse_cluster(path, data)


def load_node_config(path: Path, node_id: int | None = None) -> NodeSettings:
    """Settings for one node, from a node file or from a cluster file plus `node_id`.

    With a node file, `node_id` may be given too but must then match the file.
    """
    path = Path(path).absolute()
    data = _read_toml(path)
    if "cluster" in data or "node_id" in data:
        reader = _Reader(path, data, prefix="")
        cluster_ref = reader.path("cluster")
        file_node_id = reader.integer("node_id", 1, NODE_ID_MAX)
        reader.finish()
        if node_id is not None and node_id != file_node_id:
            raise ConfigError(
                path=path,
                key="node_id",
                problem=f"the file says node {file_node_id} but node {node_id} was asked for",
            )
        cluster_path = _relative_to(path, cluster_ref)
        if cluster_path == path:
            raise ConfigError(path=path, key="cluster", problem="a node file cannot name itself")
        cluster = load_cluster_config(cluster_path)
        chosen = file_node_id
    else:
        cluster = _parse_cluster(path, data)
        if node_id is None:
            raise ConfigError(
                path=path,
                key=None,
                problem="this is a cluster file: say which node to run (--node-id N) or pass a "
                "node file",
            )
        chosen = node_id
    if chosen not in cluster.node_ids:
        raise ConfigError(
            path=cluster.path,
            key="nodes",
            problem=f"node {chosen} is not a member (known ids: {list(cluster.node_ids)})",
        )
    return NodeSettings(
        config_path=path,
        cluster=cluster,
        node=cluster.node(chosen),
        data_dir=cluster.node_data_dir(chosen),
        log_file=cluster.node_log_file(chosen),
        pid_file=cluster.node_pid_file(chosen),
    )


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as f:
            raw = f.read(CONFIG_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        raise ConfigError(path=path, key=None, problem="file not found") from None
    except OSError as exc:
        raise ConfigError(path=path, key=None, problem=f"cannot read: {exc.strerror}") from None
    if len(raw) > CONFIG_FILE_BYTES_MAX:
        raise ConfigError(
            path=path,
            key=None,
            problem=f"larger than CONFIG_FILE_BYTES_MAX={CONFIG_FILE_BYTES_MAX} bytes",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path=path, key=None, problem=f"not UTF-8 ({exc.reason})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path=path, key=None, problem=f"not valid TOML: {exc}") from None


def _parse_cluster(path: Path, data: Mapping[str, object]) -> ClusterConfig:
    reader = _Reader(path, data, prefix="")
    cluster_id = reader.string("cluster_id", max_chars=CLUSTER_ID_CHARS_MAX)
    if not _CLUSTER_ID_RE.fullmatch(cluster_id):
        raise reader.error(
            "cluster_id",
            f"{cluster_id!r} must start with a letter or digit and use only letters, digits, "
            "'.', '_' and '-'",
        )
    dd_ms = reader.integer("dd_ms", 1, MAX_DELAY_DURATION_MS, default=DEFAULT_DD_MS)
    cs_max_ms = reader.integer("cs_max_ms", 0, MAX_CLOCK_SKEW_MS, default=DEFAULT_CS_MAX_MS)
    tick_ms = reader.integer("tick_ms", TICK_MS_MIN, TICK_MS_MAX, default=DEFAULT_TICK_MS)
    heartbeat_ms = reader.integer(
        "heartbeat_interval_ms",
        tick_ms,
        HEARTBEAT_INTERVAL_MS_MAX,
        default=DEFAULT_HEARTBEAT_INTERVAL_MS,
        low_reason="at least tick_ms: heartbeats are sent on ticks",
    )
    election_ms = reader.integer(
        "election_timeout_ms",
        ELECTION_TO_HEARTBEAT_RATIO_MIN * heartbeat_ms,
        ELECTION_TIMEOUT_MS_MAX,
        default=DEFAULT_ELECTION_TIMEOUT_MS,
        low_reason=f"at least {ELECTION_TO_HEARTBEAT_RATIO_MIN} x heartbeat_interval_ms: one late "
        "heartbeat must not start an election",
    )
    idle_ms = reader.integer(
        "idle_safe_time_interval_ms",
        tick_ms,
        dd_ms,
        default=DEFAULT_IDLE_SAFE_TIME_INTERVAL_MS,
        low_reason="at least tick_ms: idle entries are appended on ticks",
        high_reason="at most dd_ms: safe time must advance within DD, or reads at now wait",
    )
    nodes = _parse_nodes(path, reader.table_list("nodes"))
    machines = {_machine(n.host) for n in nodes}
    if len(machines) > 1 and cs_max_ms < CS_MAX_MS_SEPARATE_HOSTS_MIN:
        raise reader.error(
            "cs_max_ms",
            f"{cs_max_ms} is below {CS_MAX_MS_SEPARATE_HOSTS_MIN} for nodes on separate hosts "
            f"({', '.join(sorted({n.host for n in nodes}))}): each reads its own clock, and a "
            "follower whose clock trails the leader's by more than CSmax drops every entry; "
            "set the clock skew NTP keeps between them (CS_MAX_MS_SEPARATE_HOSTS_MIN)",
        )
    if cs_max_ms > dd_ms:
        raise reader.error(
            "cs_max_ms",
            f"{cs_max_ms} is larger than dd_ms={dd_ms}: DD must cover the clock skew, or a "
            "node with a slow clock could answer with a schema that is not yet active elsewhere",
        )
    snapshot_every = reader.integer(
        "snapshot_every_entries",
        SNAPSHOT_EVERY_ENTRIES_MIN,
        SNAPSHOT_EVERY_ENTRIES_MAX,
        default=DEFAULT_SNAPSHOT_EVERY_ENTRIES,
    )
    snapshot_keep = reader.integer(
        "snapshot_keep_entries",
        0,
        snapshot_every,
        default=min(DEFAULT_SNAPSHOT_KEEP_ENTRIES, snapshot_every),
        high_reason="at most snapshot_every_entries",
    )
    session_ttl_ms = reader.integer(
        "session_ttl_ms",
        mlimits.SESSION_TTL_MS_MIN,
        mlimits.SESSION_TTL_MS_MAX,
        default=mlimits.SESSION_TTL_MS_DEFAULT,
    )
    session_heartbeat_ms = reader.integer(
        "session_heartbeat_ms",
        SESSION_HEARTBEAT_MS_MIN,
        max(SESSION_HEARTBEAT_MS_MIN, session_ttl_ms // 3),
        default=min(mlimits.SESSION_HEARTBEAT_MS_DEFAULT, session_ttl_ms // 3),
        high_reason="at most a third of session_ttl_ms: two heartbeats may be lost in a row",
    )
    gc_interval_ms = reader.integer(
        "gc_interval_ms", GC_INTERVAL_MS_MIN, GC_INTERVAL_MS_MAX, default=GC_INTERVAL_MS_DEFAULT
    )
    client_connections_max = reader.integer(
        "client_connections_max",
        CLIENT_CONNECTIONS_MAX_MIN,
        CLIENT_CONNECTIONS_MAX_MAX,
        default=CLIENT_CONNECTIONS_MAX_DEFAULT,
    )
    gc_orphan_grace_ms = reader.integer(
        "gc_orphan_grace_ms",
        GC_ORPHAN_GRACE_MS_MIN,
        GC_ORPHAN_GRACE_MS_MAX,
        default=GC_ORPHAN_GRACE_MS_DEFAULT,
    )
    gc_delete_files_per_s = reader.integer(
        "gc_delete_files_per_s",
        1,
        GC_DELETE_FILES_PER_S_MAX,
        default=GC_DELETE_FILES_PER_S_DEFAULT,
    )
    loose_files_max = reader.integer(
        "loose_files_max",
        0,
        mlimits.MAX_FILE_ENTRIES_PER_TABLE,
        default=mlimits.LOOSE_FILES_MAX_DEFAULT,
    )
    read_staleness_max_ms = reader.integer(
        "read_staleness_max_ms",
        2 * idle_ms,
        READ_STALENESS_MAX_MS_MAX,
        default=max(READ_STALENESS_MAX_MS_DEFAULT, 2 * idle_ms),
        low_reason="at least 2 x idle_safe_time_interval_ms: a healthy node's safe time trails "
        "its clock by up to that interval",
    )
    leader_change_ms = SESSION_TTL_ELECTION_TIMEOUTS_MIN * election_ms
    if session_ttl_ms < session_heartbeat_ms + leader_change_ms:
        raise reader.error(
            "session_ttl_ms",
            f"{session_ttl_ms} is below session_heartbeat_ms + "
            f"{SESSION_TTL_ELECTION_TIMEOUTS_MIN} x election_timeout_ms = {session_heartbeat_ms}"
            f" + {leader_change_ms} = {session_heartbeat_ms + leader_change_ms}: a leader change "
            "takes up to two election timeouts before a follower campaigns, plus the vote and "
            "the client finding the new leader, and the client's last heartbeat before it may "
            "be a full interval old; a shorter TTL expires sessions (and their jobs' leases) at "
            "a leader change",
        )
    secrets_dir = reader.path("secrets_dir", default=DEFAULT_SECRETS_DIR)
    data_dir = reader.path("data_dir", default=DEFAULT_DATA_DIR)
    warehouse = reader.path("warehouse", default=DEFAULT_WAREHOUSE, uri_ok=True)
    allowed_locations = _allowed_locations(path, reader)
    log_level = reader.string("log_level", max_chars=16, default=DEFAULT_LOG_LEVEL).upper()
    if log_level not in LOG_LEVELS:
        raise reader.error("log_level", f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    tls_table = reader.optional_table("tls")
    tls = _parse_tls(path, tls_table) if tls_table is not None else None
    reader.finish()
    resolved_secrets = _relative_to(path, secrets_dir)
    resolved_data = _relative_to(path, data_dir)
    if resolved_secrets == resolved_data:
        raise reader.error("data_dir", "must differ from secrets_dir")
    return ClusterConfig(
        path=path,
        cluster_id=cluster_id,
        dd_ms=dd_ms,
        cs_max_ms=cs_max_ms,
        idle_safe_time_interval_ms=idle_ms,
        election_timeout_ms=election_ms,
        heartbeat_interval_ms=heartbeat_ms,
        tick_ms=tick_ms,
        snapshot_every_entries=snapshot_every,
        snapshot_keep_entries=snapshot_keep,
        session_ttl_ms=session_ttl_ms,
        session_heartbeat_ms=session_heartbeat_ms,
        gc_interval_ms=gc_interval_ms,
        gc_orphan_grace_ms=gc_orphan_grace_ms,
        gc_delete_files_per_s=gc_delete_files_per_s,
        client_connections_max=client_connections_max,
        loose_files_max=loose_files_max,
        read_staleness_max_ms=read_staleness_max_ms,
        secrets_dir=resolved_secrets,
        data_dir=resolved_data,
        log_level=log_level,
        warehouse=warehouse if "://" in warehouse else str(_relative_to(path, warehouse).resolve()),
        allowed_locations=allowed_locations,
        nodes=nodes,
        tls=tls,
    )


def _allowed_locations(path: Path, reader: _Reader) -> tuple[str, ...]:
    """`allowed_locations`: a list of absolute paths (relative ones are relative to this
    file), URIs, or the single entry "*". Each names a directory a location check can judge
    (no '.'/'..' segments, a file URI without a host, a URI without query or fragment)."""
    from metastore.commands import validate_location  # the catalog's rules for locations
    from metastore.ddl import check_new_location
    from metastore.errors import MetastoreError

    key = "allowed_locations"
    entries = reader.string_list(key, default=list(DEFAULT_ALLOWED_LOCATIONS))
    if len(entries) > ALLOWED_LOCATIONS_MAX:
        raise reader.error(
            key, f"{len(entries)} entries; at most {ALLOWED_LOCATIONS_MAX} (ALLOWED_LOCATIONS_MAX)"
        )
    if ANY_LOCATION in entries:
        if len(entries) > 1:
            raise reader.error(key, '"*" allows every location: list nothing else with it')
        return (ANY_LOCATION,)
    roots: list[str] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        value = reader.checked_path(where, entry, uri_ok=True)
        root = value if "://" in value else str(_relative_to(path, value).resolve())
        root = root.rstrip("/")
        if root.lower() in ("", "file:"):
            raise reader.error(where, f'{entry!r} is the whole file system: write "*" instead')
        try:
            validate_location(root, "the root")
            check_new_location(root, "the root")
        except MetastoreError as exc:
            raise reader.error(where, str(exc)) from None
        roots.append(root)
    return tuple(dict.fromkeys(roots))


def _parse_tls(path: Path, table: Mapping[str, object]) -> TlsSettings:
    # Only paths and switches are read here: whether the files exist and fit together is
    # checked by the node that uses them (raft.tls.check_node_files), since the CLI host that
    # reads this file does not hold the nodes' keys.
    reader = _Reader(path, table, prefix="tls.")
    ca_file = _relative_to(path, reader.path("ca_file"))
    patterns: dict[str, str] = {}
    for key in ("cert_file", "key_file"):
        value = reader.path(key)
        rest = value.replace(TLS_NODE_ID_PLACEHOLDER, "")
        if "{" in rest or "}" in rest:
            raise reader.error(
                key, f"{value!r}: the only placeholder allowed is {TLS_NODE_ID_PLACEHOLDER}"
            )
        patterns[key] = str(_relative_to(path, value))
    peers = reader.boolean("peers", default=True)
    clients = reader.boolean("clients", default=True)
    client_cert_required = reader.boolean("client_cert_required", default=False)
    reader.finish()
    if not (peers or clients):
        raise reader.error("peers", "peers and clients are both false: remove [tls] instead")
    if client_cert_required and not clients:
        raise reader.error("client_cert_required", "needs clients = true (TLS on the client port)")
    return TlsSettings(
        ca_file=ca_file,
        cert_file=patterns["cert_file"],
        key_file=patterns["key_file"],
        peers=peers,
        clients=clients,
        client_cert_required=client_cert_required,
    )


def _parse_nodes(path: Path, tables: list[Mapping[str, object]]) -> tuple[NodeAddress, ...]:
    if not NODES_MIN <= len(tables) <= NODES_MAX:
        raise ConfigError(
            path=path,
            key="nodes",
            problem=f"{len(tables)} [[nodes]] entries; between {NODES_MIN} and {NODES_MAX} "
            "are supported (NODES_MAX)",
        )
    nodes: list[NodeAddress] = []
    id_keys: dict[int, str] = {}
    listener_keys: dict[tuple[str, int], str] = {}  # (address as bound, port) -> its key
    for index, table in enumerate(tables):
        prefix = f"nodes[{index}]."
        reader = _Reader(path, table, prefix=prefix)
        node_id = reader.integer("id", 1, NODE_ID_MAX)
        host = reader.string("host", max_chars=HOST_CHARS_MAX)
        if not _HOST_RE.fullmatch(host):
            raise reader.error("host", f"{host!r} is not a hostname or IP address")
        if ":" in host and not _is_ipv6(host):
            # Every address brackets a host with a colon as IPv6 ([host]:port); a typo such
            # as "db:7000" would otherwise surface only when the node fails to bind.
            raise reader.error(
                "host",
                f"{host!r} is not an IPv6 address (a hostname has no ':'; ports go in *_port)",
            )
        ports = {
            name: reader.integer(name, PORT_MIN, PORT_MAX)
            for name in ("raft_port", "client_port", "metrics_port")
        }
        reader.finish()
        if node_id in id_keys:
            raise reader.error("id", f"node id {node_id} is already used by {id_keys[node_id]}")
        id_keys[node_id] = f"{prefix}id"
        for name, port in ports.items():
            # Ports must differ per host; two hosts may use the same port numbers. A host may
            # be spelled several ways (localhost, 127.0.0.1): compare the addresses it binds.
            listeners = [(address, port) for address in _bound_addresses(host)]
            clash = next((listener for listener in listeners if listener in listener_keys), None)
            if clash is not None:
                raise reader.error(name, f"{host}:{port} is already used by {listener_keys[clash]}")
            listener_keys.update(dict.fromkeys(listeners, f"{prefix}{name}"))
        nodes.append(
            NodeAddress(
                id=node_id,
                host=host,
                raft_port=ports["raft_port"],
                client_port=ports["client_port"],
                metrics_port=ports["metrics_port"],
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.id))


class _Reader:
    """Typed access to one TOML table that remembers which keys were read, so `finish()` can
    reject the rest as unknown."""

    _MISSING: ClassVar[object] = object()

    def __init__(self, path: Path, table: Mapping[str, object], *, prefix: str) -> None:
        self._path = path
        self._table = table
        self._prefix = prefix
        self._seen: set[str] = set()

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(path=self._path, key=f"{self._prefix}{key}", problem=problem)

    def _get(self, key: str, default: object) -> object:
        self._seen.add(key)
        if key in self._table:
            return self._table[key]
        if default is self._MISSING:
            raise self.error(key, "is required")
        return default

    def integer(
        self,
        key: str,
        low: int,
        high: int,
        *,
        default: int | None = None,
        low_reason: str = "",
        high_reason: str = "",
    ) -> int:
        value = self._get(key, self._MISSING if default is None else default)
        # bool is an int in Python; `true` is never a sensible port or duration.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, f"must be an integer, got {_describe(value)}")
        if value < low:
            raise self.error(key, f"{value} is below the minimum {low}" + _why(low_reason))
        if value > high:
            raise self.error(key, f"{value} is above the maximum {high}" + _why(high_reason))
        return value

    def string(self, key: str, *, max_chars: int, default: str | None = None) -> str:
        value = self._get(key, self._MISSING if default is None else default)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {_describe(value)}")
        if not value.strip():
            raise self.error(key, "must not be empty")
        if len(value) > max_chars:
            raise self.error(key, f"is longer than {max_chars} characters")
        return value

    def path(self, key: str, *, default: str | None = None, uri_ok: bool = False) -> str:
        """A string naming a file or directory (relative ones are relative to the config file:
        `_relative_to`). Refused here, not when a node first opens it: a NUL or another control
        character (no file name holds one by intent; the OS refuses a NUL with a ValueError) and
        a `~name` of a user this host does not know (expanduser raises RuntimeError)."""
        value = self.string(key, max_chars=PATH_CHARS_MAX, default=default)
        return self.checked_path(key, value, uri_ok=uri_ok)

    def string_list(self, key: str, *, default: list[str]) -> list[str]:
        value = self._get(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be an array of strings, got {_describe(value)}")
        return list(value)

    def checked_path(self, key: str, value: str, *, uri_ok: bool = False) -> str:
        """`value` (read from `key`) as `path` checks it."""
        if not value.strip():
            raise self.error(key, "must not be empty")
        if len(value) > PATH_CHARS_MAX:
            raise self.error(key, f"is longer than {PATH_CHARS_MAX} characters")
        bad = next((c for c in value if ord(c) < 0x20 or c == "\x7f"), None)
        if bad is not None:
            what = "a NUL" if bad == "\0" else f"the control character {bad!r}"
            raise self.error(key, f"{value!r} holds {what}: not a usable path")
        if uri_ok and "://" in value:
            return value
        try:
            Path(value).expanduser()
        except RuntimeError:
            user = value.split("/", 1)[0]
            raise self.error(
                key, f"{value!r}: cannot expand {user} (no such user's home directory here)"
            ) from None
        return value

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {_describe(value)}")
        return value

    def optional_table(self, key: str) -> Mapping[str, object] | None:
        value = self._get(key, None)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table ([{key}]), got {_describe(value)}")
        return value

    def table_list(self, key: str) -> list[Mapping[str, object]]:
        value = self._get(key, self._MISSING)
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise self.error(key, f"must be an array of tables ([[{key}]]), got {_describe(value)}")
        return list(value)

    def finish(self) -> None:
        unknown = sorted(set(self._table) - self._seen)
        if unknown:
            known = sorted(self._seen)
            raise self.error(
                unknown[0],
                f"unknown key (known keys here: {', '.join(known)})",
            )


def _why(reason: str) -> str:
    return f" ({reason})" if reason else ""


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"{type(value).__name__} {value!r}"


def _relative_to(config_file: Path, value: str) -> Path:
    # Relative to the file, not the working directory: see the module docstring.
    p = Path(value).expanduser()
    return p if p.is_absolute() else config_file.parent / p


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _bound_addresses(host: str) -> tuple[str, ...]:
    """What a listener on `host` occupies, in one spelling per address: an IP address in its
    canonical form (::ffff:127.0.0.1 is 127.0.0.1), a loopback name both loopback addresses it
    may resolve to, another name itself (lower case, without a trailing dot). Names are not
    looked up: the config is read on hosts (the CLI's) whose resolver may differ from the
    nodes'."""
    name = host.lower().rstrip(".")
    if name in _LOOPBACK_NAMES:
        return ("127.0.0.1", "::1")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return (name,)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (str(address),)


def _machine(host: str) -> str:
    """Which machine (which clock) `host` names, as far as can be told without a lookup: every
    loopback address and name is this one; other names and addresses stand for themselves."""
    (address,) = _bound_addresses(host)[:1]
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address
    return "loopback" if loopback else address


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- rendering (metastore cluster init) ------------------------------------------------------


def node_file_name(node_id: int) -> str:
    return f"node{node_id}.toml"


def node_layout(count: int, *, host: str, base_port: int) -> tuple[NodeAddress, ...]:
    """Members 1..count on one host: Raft base+N, clients base+100+N, metrics base+200+N."""
    if not NODES_MIN <= count <= NODES_MAX:
        raise ValueError(f"node count {count} is outside {NODES_MIN}..{NODES_MAX} (NODES_MAX)")
    if base_port + 1 < PORT_MIN or base_port + METRICS_PORT_OFFSET + count > PORT_MAX:
        raise ValueError(
            f"base port {base_port} puts ports outside {PORT_MIN}..{PORT_MAX} "
            f"(it needs base+{METRICS_PORT_OFFSET}+{count} <= {PORT_MAX})"
        )
    return tuple(
        NodeAddress(
            id=i,
            host=host,
            raft_port=base_port + i,
            client_port=base_port + CLIENT_PORT_OFFSET + i,
            metrics_port=base_port + METRICS_PORT_OFFSET + i,
        )
        for i in range(1, count + 1)
    )


def render_cluster_toml(
    *,
    cluster_id: str,
    nodes: Sequence[NodeAddress],
    dd_ms: int = DEFAULT_DD_MS,
    cs_max_ms: int = DEFAULT_CS_MAX_MS,
    idle_safe_time_interval_ms: int = DEFAULT_IDLE_SAFE_TIME_INTERVAL_MS,
    election_timeout_ms: int = DEFAULT_ELECTION_TIMEOUT_MS,
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
    tick_ms: int = DEFAULT_TICK_MS,
    snapshot_every_entries: int = DEFAULT_SNAPSHOT_EVERY_ENTRIES,
    session_ttl_ms: int = mlimits.SESSION_TTL_MS_DEFAULT,
    session_heartbeat_ms: int = mlimits.SESSION_HEARTBEAT_MS_DEFAULT,
    secrets_dir: str = DEFAULT_SECRETS_DIR,
    data_dir: str = DEFAULT_DATA_DIR,
    warehouse: str = DEFAULT_WAREHOUSE,
    log_level: str = DEFAULT_LOG_LEVEL,
    tls_dir: str | None = None,
) -> str:
    """A commented cluster.toml. Values are not validated here: load the result (as
    `cluster init` does before writing it) to validate. `tls_dir`: TLS on, with the CA and node
    certificates in that directory (relative to the file); None: TLS off, documented in a
    commented-out [tls] table."""
    lines = [
        "# Cluster-wide settings: the same file on every host.",
        "# Generated by `metastore cluster init`; see cluster_configs/production-example/ for",
        "# what each setting means in production.",
        "",
        f"cluster_id = {_toml_str(cluster_id)}",
        "",
        "# IEP-98 timing. A schema change made at Tm activates at Tu = Tm + DD; a DDL returns",
        "# once now >= Tu + CSmax. CSmax is the clock skew tolerated between hosts: at most DD,",
        "# and at least 10 when the nodes are on separate hosts. Both are fixed when the cluster",
        "# is first started.",
        f"dd_ms = {dd_ms}",
        f"cs_max_ms = {cs_max_ms}",
        "# An idle leader appends a tick entry this often so safe time keeps moving (< DD).",
        f"idle_safe_time_interval_ms = {idle_safe_time_interval_ms}",
        "",
        "# Raft timing.",
        f"election_timeout_ms = {election_timeout_ms}",
        f"heartbeat_interval_ms = {heartbeat_interval_ms}",
        f"tick_ms = {tick_ms}",
        f"snapshot_every_entries = {snapshot_every_entries}",
        "",
        "# Client sessions (Spark applications) hold schema leases while they heartbeat; a",
        "# session silent for session_ttl_ms expires and its leases stop blocking schema changes.",
        "# It must outlive a leader change: >= session_heartbeat_ms + 3 x election_timeout_ms.",
        f"session_ttl_ms = {session_ttl_ms}",
        f"session_heartbeat_ms = {session_heartbeat_ms}",
        "",
        "# The leader's GC: every gc_interval_ms it moves each table's GC threshold to now minus",
        "# the table's gc.ttl (held below protected timestamps) and deletes the files no read",
        "# above it can see, plus unreferenced files older than gc_orphan_grace_ms.",
        f"gc_interval_ms = {GC_INTERVAL_MS_DEFAULT}",
        f"gc_orphan_grace_ms = {GC_ORPHAN_GRACE_MS_DEFAULT}",
        f"gc_delete_files_per_s = {GC_DELETE_FILES_PER_S_DEFAULT}",
        "",
        "# Writers move a table's older file entries into manifest files once it holds more",
        "# than this many loose ones (0: only `metastore table compact` does).",
        f"loose_files_max = {mlimits.LOOSE_FILES_MAX_DEFAULT}",
        "",
        "# A node lists files only while its safe time trails its clock by at most this, and",
        "# GC deletes a file only this long (+ cs_max_ms) after freeing it: a node that stopped",
        "# applying refuses (NOT_READY, clients retry elsewhere) instead of listing deleted files.",
        f"read_staleness_max_ms = {READ_STALENESS_MAX_MS_DEFAULT}",
        "",
        "# Relative to this file. Never commit either directory.",
        f"secrets_dir = {_toml_str(secrets_dir)}",
        f"data_dir = {_toml_str(data_dir)}",
        "# Where table data (Parquet) lives: a path relative to this file, an absolute path,",
        "# or a URI Spark and pyarrow can write (e.g. s3a://bucket/warehouse).",
        f"warehouse = {_toml_str(warehouse)}",
        "# CREATE TABLE ... LOCATION may name a directory inside the warehouse or inside one of",
        '# these (absolute paths, paths relative to this file, or URIs); ["*"] allows any',
        "# location. The leader refuses a new table outside them, and its GC deletes nothing",
        "# outside them (a table created there before is left alone, its files kept).",
        "allowed_locations = []",
        f"log_level = {_toml_str(log_level)}",
    ]
    for n in nodes:
        lines += [
            "",
            "[[nodes]]",
            f"id = {n.id}",
            f"host = {_toml_str(n.host)}",
            f"raft_port = {n.raft_port}        # Raft peers (authenticated with cluster.secret)",
            f"client_port = {n.client_port}      # metastore clients: CLI, Spark drivers",
            f"metrics_port = {n.metrics_port}     # Prometheus /metrics and /health",
        ]
    if tls_dir is None:
        lines += [
            "",
            "# TLS is off. To turn it on, create certificates next to this file with",
            "#   metastore cluster certs --out tls --nodes N [--host NAME_OR_IP ...]",
            "# and uncomment the table below (cluster_configs/production-example explains each",
            "# key). Clients then pass --cacert tls/ca.crt (METASTORE_CACERT).",
        ]
    else:
        lines += [
            "",
            "# TLS is on: mutual TLS between peers and TLS on the client port, with the dev CA",
            f"# and node certificates `cluster init --tls` made in {tls_dir}/ (keep its ca.key",
            f"# off the nodes). Clients pass --cacert {tls_dir}/ca.crt (METASTORE_CACERT).",
        ]
    comment = "# " if tls_dir is None else ""
    where = tls_dir if tls_dir is not None else "tls"
    lines += [
        f"{comment}[tls]",
        f"{comment}ca_file = {_toml_str(where + '/ca.crt')}",
        f"{comment}cert_file = {_toml_str(where + '/node-{node_id}.crt')}",
        f"{comment}key_file = {_toml_str(where + '/node-{node_id}.key')}",
        f"{comment}peers = true",
        f"{comment}clients = true",
        f"{comment}client_cert_required = false",
    ]
    return "\n".join(lines) + "\n"


def render_node_toml(node_id: int, *, cluster_file: str = CLUSTER_FILE_NAME) -> str:
    return (
        f"# Node {node_id} of the cluster described in {cluster_file} (relative to this file).\n"
        f"# Start it with: metastore node start --config {node_file_name(node_id)}\n"
        "# (add --bootstrap to its first start in a new cluster; `metastore cluster up` does)\n"
        f"cluster = {_toml_str(cluster_file)}\n"
        f"node_id = {node_id}\n"
    )


def _toml_str(value: str) -> str:
    # A TOML basic string; JSON escaping is a subset of TOML's for the characters we allow.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    if any(ord(c) < 0x20 or c == "\x7f" for c in escaped):
        raise ValueError(f"{value!r} contains control characters")
    return f'"{escaped}"'
