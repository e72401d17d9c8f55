"""`metastore cluster ...`: create a cluster's config, start/stop it locally, inspect it, and
change its membership."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click
from rich.console import RenderableType
from rich.text import Text

from cli import processes
from cli.context import (
    LOCAL_CONFIG_DIR,
    App,
    DurationParam,
    app,
    config_dir_option,
    nothing_listens,
    nothing_listens_hint,
)
from cli.errors import (
    EXIT_AUTH,
    EXIT_GENERIC,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    REQUEST_ID_HELP,
    CliError,
    settle_unknown_outcome,
    writing_file,
)
from cli.output import (
    emit,
    end_progress,
    endpoint_results_doc,
    kv_table,
    progress,
    rows_table,
    safe_time_lag_cell,
    ts_cell,
)
from cli.waiting import WAIT_DURATION, parse_wait_ms
from metastore.apply_version import MAX_APPLY_VERSION
from metastore.client import EndpointResult, SyncMetastoreClient, parse_endpoint
from metastore.client.protocol import CHECK_CLUSTER_HINT, MEMBERSHIP_OUTCOME_HINT
from metastore.daemon.api_limits import REQUEST_TIMEOUT_MS_MAX
from metastore.daemon.config import (
    CLUSTER_FILE_NAME,
    DEFAULT_BASE_PORT,
    METRICS_PORT_OFFSET,
    NODE_ID_MAX,
    NODES_MAX,
    NODES_MIN,
    ClusterConfig,
    ConfigError,
    load_cluster_config,
    load_node_config,
    node_file_name,
    node_layout,
    render_cluster_toml,
    render_node_toml,
)
from metastore.daemon.secrets import Role, ensure_secrets, read_token_file, token_file_name
from metastore.errors import ErrorCode, InvalidArgumentError, MetastoreError
from raft.oserror import os_error_text

# `cluster up`: how long to wait for a ready leader and the started nodes, and how often to look.
UP_WAIT_MS_DEFAULT: Final = 30_000
UP_WAIT_MS_MAX: Final = 10 * 60 * 1000
# `cluster init --base-port` is at least this: below it a layout would use privileged,
# well-known ports (and 0 does not mean "pick free ports": node 1 would get port 1).
INIT_BASE_PORT_MIN: Final = 1024
UP_POLL_INTERVAL_MS: Final = 200
# Each status probe during `cluster up` is short: a node that is still starting refuses fast.
UP_PROBE_TIMEOUT_MS: Final = 1_000
# Lines written to a cluster config dir's .gitignore: node data and secrets are never committed.
CONFIG_GITIGNORE: Final = (
    "# Node data, logs, secrets and TLS keys: never commit these.\ndata/\nsecrets/\ntls/\n"
)
_CLUSTER_ID_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")

CONFIG_DIR_OPTION_HELP = "Directory holding cluster.toml and nodeN.toml."


@click.group("cluster")
def cluster() -> None:
    """Create, start, stop and inspect a cluster; change its membership."""


# ---- init ------------------------------------------------------------------------------------


@cluster.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--nodes", "count", type=click.IntRange(NODES_MIN, NODES_MAX), default=3, help="Members."
)
@click.option("--host", default="127.0.0.1", help="Host every member listens on.")
@click.option(
    "--base-port",
    type=click.IntRange(INIT_BASE_PORT_MIN, 65_535),
    default=DEFAULT_BASE_PORT,
    show_default=True,
    metavar="BASE",
    help="Node N listens on BASE+N (Raft), BASE+100+N (clients), BASE+200+N (metrics), "
    "so BASE+200+N must stay at most 65535.",
)
@click.option(
    "--cluster-id", help="Cluster id shared by every member. Default: the directory's name."
)
@click.option("--force", is_flag=True, help="Overwrite existing cluster.toml / nodeN.toml.")
@click.option(
    "--tls",
    is_flag=True,
    help="Turn TLS on: create a dev CA and node certificates in DIRECTORY/tls (for --host, "
    "127.0.0.1 and localhost) and enable [tls].",
)
@click.pass_context
def cluster_init(
    ctx: click.Context,
    directory: Path,
    count: int,
    host: str,
    base_port: int,
    cluster_id: str | None,
    force: bool,
    tls: bool,
) -> None:
    """Write DIRECTORY/cluster.toml and nodeN.toml for a cluster on one host, and create its
    secrets (DIRECTORY/secrets: peer secret, tokens.json with token hashes, and the admin,
    writer and reader tokens, all mode 0600). With --tls, also a dev CA and certificates
    (DIRECTORY/tls, as `cluster certs` makes them) and an enabled [tls] table.

    Existing secrets are kept, also with --force; so is an existing DIRECTORY/tls/ca.crt and
    the certificates beside it. With --force over an existing cluster.toml, its cluster id,
    host and base port are kept unless --cluster-id, --host or --base-port are given, and TLS
    stays on if it was (growing a cluster: `--nodes 4 --force` keeps the members where they
    run).

    \b
    Example:
      metastore cluster init /tmp/ms --nodes 3 --base-port 25100
    """
    a = app(ctx)
    kept = _kept_from_existing(ctx, directory) if force else {}
    cluster_id = kept.get("cluster_id", cluster_id)
    host = kept.get("host", host)
    base_port = kept.get("base_port", base_port)
    tls = kept.get("tls", tls)
    cid = cluster_id if cluster_id is not None else _default_cluster_id(directory)
    try:
        layout = node_layout(count, host=host, base_port=base_port)
        files = {
            CLUSTER_FILE_NAME: render_cluster_toml(
                cluster_id=cid, nodes=layout, tls_dir=INIT_TLS_DIR if tls else None
            )
        }
    except ValueError as exc:  # a port range or a control character TOML cannot hold
        raise CliError("USAGE", str(exc), exit_code=EXIT_USAGE) from None
    for n in layout:
        files[node_file_name(n.id)] = render_node_toml(n.id)
    existing = sorted(name for name in files if (directory / name).exists())
    if existing and not force:
        raise CliError(
            "ALREADY_EXISTS",
            f"{directory} already has {', '.join(existing)}; pass --force to overwrite",
            exit_code=EXIT_REFUSED,
        )
    # The outermost directory this creates: removed again if the options are refused below.
    created = next((p for p in reversed([directory, *directory.parents]) if not p.exists()), None)
    directory.mkdir(parents=True, exist_ok=True)
    # Validate the rendered cluster file with the real loader before anything is replaced.
    staged = directory / f".{CLUSTER_FILE_NAME}.{os.getpid()}.tmp"
    try:
        with writing_file(directory / CLUSTER_FILE_NAME, staged=staged):
            staged.write_text(files[CLUSTER_FILE_NAME])
    except CliError:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    try:
        config = load_cluster_config(staged)
    except BaseException as exc:
        staged.unlink(missing_ok=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, ConfigError):  # an option's value: say which, not the staged file
            message = f"{exc.key}: {exc.problem}" if exc.key else exc.problem
            raise CliError("USAGE", message, exit_code=EXIT_USAGE) from None
        raise
    for name, text in files.items():
        with writing_file(directory / name):
            if name == CLUSTER_FILE_NAME:
                os.replace(staged, directory / name)
            else:
                (directory / name).write_text(text)
    gitignore = directory / ".gitignore"
    if not gitignore.exists():
        with writing_file(gitignore):
            gitignore.write_text(CONFIG_GITIGNORE)
    secrets = ensure_secrets(config.secrets_dir)
    token_files = {r.wire_name: str(secrets.token_file(r)) for r in Role}
    doc: dict[str, Any] = {
        "directory": str(directory),
        "cluster_id": cid,
        "files": [str(directory / name) for name in files],
        "secrets_dir": str(config.secrets_dir),
        "token_files": token_files,
        "endpoints": config.client_endpoints(),
    }
    if kept:
        doc["kept"] = kept
    if config.tls is not None:
        doc["ca_file"] = str(_init_certs(directory / INIT_TLS_DIR, config, host))

    def tables() -> list[RenderableType]:
        nodes = rows_table(
            ["node", "raft", "client", "metrics"],
            [[n.id, n.raft_address, n.client_address, n.metrics_address] for n in layout],
        )
        info = kv_table(
            {
                "files": ", ".join(files),
                "secrets_dir": str(config.secrets_dir),
                "admin token": token_files[Role.ADMIN.wire_name],
            }
        )
        # A line of its own, not the table's title: a title wraps at the narrow table's width.
        title = Text(f"cluster {cid!r} in {directory}", no_wrap=True, overflow="ignore")
        out: list[RenderableType] = [title, nodes, info]
        if kept:
            out.append(Text(_kept_text(kept)))
        return [*out, _init_next_steps(doc)]

    emit(a.output, doc, tables)


INIT_TLS_DIR: Final = "tls"


def _kept_from_existing(ctx: click.Context, directory: Path) -> dict[str, Any]:
    """What `init --force` keeps of DIRECTORY's existing cluster.toml for each option not
    given: its cluster id, its one host, its base port (node N's Raft port - N) and TLS on.
    `init DIR --nodes 4 --force` grows a cluster (README): the defaults would move its running
    members to other ports, under another id, without TLS. A file that does not load is
    written over, as before."""
    try:
        existing = load_cluster_config(directory / CLUSTER_FILE_NAME)
    except (ConfigError, OSError):
        return {}

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    kept: dict[str, Any] = {}
    if not given("cluster_id"):
        kept["cluster_id"] = existing.cluster_id
    hosts = {n.host for n in existing.nodes}
    if not given("host") and len(hosts) == 1:
        kept["host"] = next(iter(hosts))
    first = min(existing.nodes, key=lambda n: n.id)
    if not given("base_port") and first.raft_port - first.id >= INIT_BASE_PORT_MIN:
        kept["base_port"] = first.raft_port - first.id
    if not given("tls") and existing.tls is not None:
        kept["tls"] = True
    # Said only where it differs from what the defaults would have written.
    defaults = {
        "cluster_id": _default_cluster_id(directory),
        "host": ctx.params["host"],
        "base_port": ctx.params["base_port"],
    }
    return {k: v for k, v in kept.items() if defaults.get(k) != v}


def _kept_text(kept: dict[str, Any]) -> str:
    said = {"cluster_id": "cluster id {!r}", "host": "host {}", "base_port": "base port {}"}
    parts = ", ".join("TLS on" if k == "tls" else said[k].format(v) for k, v in kept.items())
    return f"kept from the existing cluster.toml (options not given): {parts}"


def _init_next_steps(doc: dict[str, Any]) -> Text:
    """What to run next, with this cluster's directory and client ports, ready to paste (the
    README's example ports are those of the default --base-port only)."""
    lines = [
        "next: start it, then point the CLI at it:",
        f"  metastore cluster up --config {shlex.quote(doc['directory'])}",
        f"  export METASTORE_ENDPOINTS={','.join(doc['endpoints'])}",
        f"  export METASTORE_TOKEN_FILE={shlex.quote(doc['token_files'][Role.ADMIN.wire_name])}",
    ]
    if "ca_file" in doc:
        lines.append(f"  export METASTORE_CACERT={shlex.quote(doc['ca_file'])}")
    lines.append(f"  (or: metastore cluster status --config {shlex.quote(doc['directory'])})")
    return Text("\n".join(lines), no_wrap=True, overflow="ignore")


def _init_certs(tls_dir: Path, config: ClusterConfig, host: str) -> Path:
    """The CA file of `cluster init --tls`: kept if it exists (like the secrets), otherwise a
    new dev CA with certificates for every member."""
    from metastore.daemon.certs import CA_CERT_FILE, CertsError, generate_dev_certs

    ca_file = tls_dir / CA_CERT_FILE
    if ca_file.exists():
        return ca_file
    hosts = list(dict.fromkeys([host, *CERTS_DEFAULT_HOSTS]))
    try:
        return generate_dev_certs(tls_dir, node_ids=list(config.node_ids), hosts=hosts).ca_cert
    except CertsError as exc:
        raise CliError("CERTS_REFUSED", str(exc), exit_code=EXIT_REFUSED) from None


# Mirrors of metastore.daemon.certs' defaults: that module imports `cryptography`, which every
# other command would pay for at start if it were imported here.
CERTS_DEFAULT_HOSTS: Final = ("127.0.0.1", "localhost")
CERTS_DEFAULT_VALID_DAYS: Final = 365
CERTS_VALID_DAYS_MAX: Final = 3650


@cluster.command("certs")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    metavar="OUT",
    help="Directory for the files (created; existing files are never overwritten).",
)
@click.option(
    "--nodes", "count", type=click.IntRange(NODES_MIN, NODES_MAX), default=3, help="Nodes 1..N."
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A name or IP address peers and clients dial (repeatable). Default: 127.0.0.1 and "
    "localhost.",
)
@click.option(
    "--valid-days",
    type=click.IntRange(1, CERTS_VALID_DAYS_MAX),
    default=CERTS_DEFAULT_VALID_DAYS,
    help="How long the certificates are valid.",
)
@click.option(
    "--ca-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    metavar="CA_DIR",
    help="Issue new node certificates with the existing dev CA in this directory (its ca.crt "
    "and ca.key) instead of making a new CA: certificate rotation. Needs --node.",
)
@click.option(
    "--node",
    "node_ids",
    type=click.IntRange(min=1),
    multiple=True,
    help="With --ca-dir: the node id to issue a certificate for (repeatable).",
)
@click.pass_context
def cluster_certs(
    ctx: click.Context,
    out_dir: Path,
    count: int,
    hosts: tuple[str, ...],
    valid_days: int,
    ca_dir: Path | None,
    node_ids: tuple[int, ...],
) -> None:
    """Create a development CA and certificates for nodes 1..N and one client.

    Writes OUT/ca.crt and ca.key (keep the CA key off the nodes), OUT/node-N.crt and .key
    (subject CN node-N: peers accept a node's certificate for that node only) and
    OUT/client.crt and .key. Keys are mode 0600. Then enable [tls] in cluster.toml and give
    clients --cacert OUT/ca.crt. For production, prefer certificates from your own PKI with the
    same names (see cluster_configs/production-example/cluster.toml).

    Rotation (a leaked or old node certificate): issue a new one with the same CA, restart
    the node on it, then revoke the old one (`cluster revoke-cert OLD.crt`).

    \b
    Examples:
      metastore cluster certs --out cluster_configs/local/tls --nodes 3
      metastore cluster certs --ca-dir cluster_configs/local/tls --node 2 --out /tmp/new-2
    """
    from metastore.daemon.certs import CertsError, generate_dev_certs, issue_node_certs

    a = app(ctx)
    if (ca_dir is None) != (not node_ids):
        raise CliError("USAGE", "--ca-dir and --node go together", exit_code=EXIT_USAGE)
    if ca_dir is not None:
        try:
            issued = issue_node_certs(
                ca_dir,
                out_dir,
                node_ids=list(node_ids),
                hosts=hosts or CERTS_DEFAULT_HOSTS,
                valid_days=valid_days,
            )
        except CertsError as exc:
            raise CliError("CERTS_REFUSED", str(exc), exit_code=EXIT_REFUSED) from None
        issued_doc = {str(n): {"cert": str(c), "key": str(k)} for n, (c, k) in issued.items()}
        emit(
            a.output,
            {"ca_dir": str(ca_dir), "nodes": issued_doc},
            lambda: [kv_table({f"node-{n}": str(c) for n, (c, _) in issued.items()})],
        )
        return
    try:
        made = generate_dev_certs(
            out_dir,
            node_ids=list(range(1, count + 1)),
            hosts=hosts or CERTS_DEFAULT_HOSTS,
            valid_days=valid_days,
        )
    except CertsError as exc:
        raise CliError("CERTS_REFUSED", str(exc), exit_code=EXIT_REFUSED) from None
    doc = {
        "ca_file": str(made.ca_cert),
        "ca_key": str(made.ca_key),
        "nodes": {str(n): {"cert": str(c), "key": str(k)} for n, (c, k) in made.node_certs.items()},
        "client": {"cert": str(made.client_cert[0]), "key": str(made.client_cert[1])},
        "hosts": list(hosts or CERTS_DEFAULT_HOSTS),
    }
    emit(a.output, doc, lambda: [kv_table({p.name: str(p) for p in made.all_files()})])


def _default_cluster_id(directory: Path) -> str:
    name = _CLUSTER_ID_UNSAFE.sub("-", directory.absolute().name).strip("-._")
    return name or "metastore"


# ---- up / down -------------------------------------------------------------------------------


_config_dir_option = click.option(
    "--config",
    "config_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=LOCAL_CONFIG_DIR,
    metavar="DIR",
    help=CONFIG_DIR_OPTION_HELP,
)


@cluster.command("up")
@_config_dir_option
@click.option(
    "--wait",
    "wait_duration_ms",
    type=DurationParam(max_ms=UP_WAIT_MS_MAX),
    default=None,
    help="How long to wait for a ready leader and the started nodes (30s, 2m, at most 10m; a "
    "bare number is seconds; 0: do not wait). Default: 30s.",
)
@click.option(
    "--wait-ms",
    type=click.IntRange(0, UP_WAIT_MS_MAX),
    default=None,
    help="--wait in milliseconds (as earlier releases took it).",
)
@click.option(
    "--missing",
    "only_missing",
    is_flag=True,
    help="Start only the nodes that are not running (e.g. one that crashed) instead of refusing.",
)
@click.option(
    "--bootstrap",
    "bootstrap_ids",
    type=click.IntRange(min=1),
    multiple=True,
    metavar="NODE_ID",
    help="Start NODE_ID as a first start (it creates its identity in its empty data directory) "
    "although other nodes already have state: for a node whose first start was interrupted or "
    "failed. Never for a node whose data was lost. Repeatable.",
)
@click.pass_context
def cluster_up(
    ctx: click.Context,
    config_dir: Path,
    wait_duration_ms: int | None,
    wait_ms: int | None,
    only_missing: bool,
    bootstrap_ids: tuple[int, ...],
) -> None:
    """Start every node of the cluster in DIR (--config) as background processes and wait
    until a leader is ready and every started node serves.

    Each node runs `python -m cli.main node start --config DIR/nodeN.toml` in its own
    session, logs to DATA_DIR/node-N/node.log and records its PID in DATA_DIR/node-N/node.pid.
    It asks the nodes with DIR's admin token, unless the --token or --token-file flag gives
    one (METASTORE_TOKEN and METASTORE_TOKEN_FILE may be another cluster's).
    Refuses to start anything if a node is already running, unless --missing: then only the
    nodes that are not running are started (nothing, if all are). Stop them with `cluster down`.
    A node started by hand (`metastore node start`: no pid file, but it holds its log) counts as
    running: it is left alone, and `cluster down` does not stop it.
    Refuses to start anything (PORT_IN_USE) if another process holds a port of a node it would
    start, (DATA_DIR_UNUSABLE) if a node's data directory or log file cannot be made, or
    (CONFIG_INVALID) if a nodeN.toml does not load or names another node or cluster file, or
    (TLS_CONFIG_INVALID) if a node's [tls] files would not let it start.

    A brand-new cluster (no node has state yet) is bootstrapped. If a node has no state while
    others have (the first `cluster up` was interrupted before it started, or its first start
    failed), nothing is started and the error names the command to run: the same with
    `--bootstrap N`. Ctrl-C leaves the nodes already started running and says how to go on.

    \b
    Examples:
      metastore cluster up --config cluster_configs/mycluster
      metastore cluster up --missing --config cluster_configs/mycluster
    """
    if wait_duration_ms is not None and wait_ms is not None:
        raise click.UsageError("--wait and --wait-ms both say how long to wait: pass one")
    if wait_ms is None:
        wait_ms = UP_WAIT_MS_DEFAULT if wait_duration_ms is None else wait_duration_ms
    a = app(ctx)
    config = load_cluster_config(config_dir / CLUSTER_FILE_NAME)
    # One `cluster up`/`down` of a cluster at a time: two would both find no node running and
    # both start every node, and the second set's PIDs would replace the first's.
    with processes.lifecycle_lock(config.data_dir, "cluster up"):
        _cluster_up(a, config, config_dir, wait_ms, only_missing, bootstrap_ids)


def _cluster_up(
    a: App,
    config: ClusterConfig,
    config_dir: Path,
    wait_ms: int,
    only_missing: bool,
    bootstrap_ids: tuple[int, ...],
) -> None:
    running: dict[int, int | None] = {
        n.id: pid
        for n in config.nodes
        if (pid := processes.running_node_pid(config.node_pid_file(n.id), config_dir, n.id))
        is not None
    }
    # A node started by hand (`metastore node start`, a service manager) has no pid file of
    # ours but holds its log: it runs, and is neither started again (its ports and log are
    # taken: PORT_IN_USE would refuse the whole command) nor given a pid file (`cluster down`
    # must not stop what it did not start).
    by_hand = sorted(
        n.id
        for n in config.nodes
        if n.id not in running and processes.log_held_by_a_process(config.node_data_dir(n.id))
    )
    running.update(dict.fromkeys(by_hand))
    # Refusing by default keeps a half-running cluster visible: the user decides whether to
    # restart the missing nodes (--missing) or start over (`cluster down`).
    if running and not only_missing:
        listed = ", ".join(
            f"node {n} (pid {p})" if p is not None else f"node {n} (started by hand)"
            for n, p in sorted(running.items())
        )
        raise CliError(
            "ALREADY_RUNNING",
            f"{listed} already running; stop the cluster first: metastore cluster down --config "
            f"{config_dir}, or start only the nodes that are not running: metastore cluster up "
            f"--missing --config {config_dir}",
            exit_code=EXIT_REFUSED,
        )
    to_start = [n.id for n in config.nodes if n.id not in running]
    for node_id in by_hand:
        click.echo(
            f"node {node_id} is running, not started by cluster up (no pid file in "
            f"{config.node_data_dir(node_id)}): left alone; `cluster down` does not stop it",
            err=True,
        )
    for node_id in to_start:
        _check_node_file(config_dir, config, node_id)
        _check_tls_files(config, node_id)
    bootstrap = _nodes_to_bootstrap(
        config, config_dir, to_start, set(bootstrap_ids), only_missing=only_missing
    )
    taken = processes.taken_ports([config.node(n) for n in to_start])
    if taken:
        listed = "; ".join(f"node {t.node_id}'s {t.what} port {t.address}" for t in taken)
        raise CliError(
            "PORT_IN_USE",
            f"{listed}: in use by another process; nothing was started. Stop that process, "
            f"or give the node other ports in {config.path}"
            + _init_on_other_ports(config, config_dir, brand_new=bootstrap == set(to_start)),
            exit_code=EXIT_REFUSED,
        )
    for node_id in to_start:
        try:
            processes.prepare_node_files(
                config.node_data_dir(node_id), config.node_log_file(node_id)
            )
        except OSError as exc:
            raise CliError(
                "DATA_DIR_UNUSABLE",
                f"node {node_id}: {os_error_text(exc)}; nothing was started",
            ) from None
    secrets = ensure_secrets(config.secrets_dir)
    started: list[processes.StartedNode] = []
    try:
        for node_id in to_start:
            try:
                node = processes.start_node(
                    node_id,
                    processes.node_command(
                        config_dir, config, node_id, bootstrap=node_id in bootstrap
                    ),
                    data_dir=config.node_data_dir(node_id),
                    log_file=config.node_log_file(node_id),
                    pid_file=config.node_pid_file(node_id),
                )
            except CliError as exc:
                raise _start_failed_after(exc, started, config_dir) from None
            started.append(node)
            s = started[-1]
            click.echo(f"started node {s.node_id} (pid {s.pid}), log: {s.log_file}", err=True)
        if wait_ms == 0:
            doc = {"started": {str(s.node_id): s.pid for s in started}}
            emit(a.output, doc, lambda: [kv_table({f"node {s.node_id}": s.pid for s in started})])
            return
        # This cluster's admin token unless a flag names another: a METASTORE_TOKEN_FILE
        # exported for another cluster (the README's restore) would wait out its --wait.
        token = a.token_for_cluster(config)
        token_source = (
            "--token"
            if a.token_explicit
            else str(a.token_file)
            if a.token_file_explicit
            else str(secrets.token_file(Role.ADMIN))
        )
        if token is None:
            token = read_token_file(secrets.token_file(Role.ADMIN))
        with SyncMetastoreClient(
            config.client_endpoints(),
            token,
            timeout_ms=UP_PROBE_TIMEOUT_MS,
            client_name="metastore-up",
            tls=a.client_tls(config),
        ) as client:
            results = _wait_for_leader(client, started, config, wait_ms, token_source)
    except KeyboardInterrupt:
        end_progress()
        raise _interrupted(config_dir, started, to_start, bootstrap) from None
    emit(a.output, endpoint_results_doc(results), lambda: [_status_table(results)])


def _start_failed_after(
    exc: CliError, started: list[processes.StartedNode], config_dir: Path
) -> CliError:
    """`exc` (a node could not be started) with what the nodes this call started before it
    are doing: they run, tracked by their pid files, and the user must decide what becomes of
    them (the error alone read as if nothing had started)."""
    if not started:
        return exc
    listed = ", ".join(f"node {s.node_id} (pid {s.pid})" for s in started)
    verb = "runs" if len(started) == 1 else "run"
    message = (
        f"{exc.message}; {listed}, started before it, {verb} on: stop "
        f"{'it' if len(started) == 1 else 'them'} with `metastore cluster down --config "
        f"{config_dir}`, or fix the cause and start the rest with `metastore cluster up "
        f"--missing --config {config_dir}`"
    )
    return CliError(exc.code, message, exit_code=exc.exit_code, details=exc.details)


def _check_node_file(config_dir: Path, config: ClusterConfig, node_id: int) -> None:
    """The nodeN.toml `cluster up` would start node `node_id` with (`processes.node_command`),
    loaded as the node will load it, before any node starts: it must be valid and name that
    node of this cluster file (ConfigError naming the file and key otherwise), or a typo there
    stops the node after the others started, and a wrong id or cluster starts another node."""
    node_file = config_dir / node_file_name(node_id)
    if not node_file.exists():
        return  # the node gets the cluster file and --node-id
    settings = load_node_config(node_file, node_id)
    if settings.cluster.path.resolve() != config.path.resolve():
        raise ConfigError(
            path=settings.config_path,
            key="cluster",
            problem=f"names another cluster file ({settings.cluster.path}) than the one "
            f"`cluster up` starts ({config.path})",
        )


def _check_tls_files(config: ClusterConfig, node_id: int) -> None:
    """Node `node_id`'s [tls] files, checked as the node checks them at its start (readable,
    PEM, the key matches, signed by the CA, valid now), before any node starts: the nodes of
    `cluster up` run here, so their files are here too."""
    if config.tls is None:
        return
    from raft.errors import TlsConfigError
    from raft.tls import check_node_files

    try:
        check_node_files(config.tls.node_files(node_id))
    except TlsConfigError as exc:
        raise CliError(
            "TLS_CONFIG_INVALID",
            f"node {node_id}: {exc}; nothing was started",
            exit_code=EXIT_USAGE,
        ) from None


def _up_command(config_dir: Path, *, missing: bool, bootstrap: list[int]) -> str:
    return " ".join(
        [
            "metastore cluster up",
            *(["--missing"] if missing else []),
            *(f"--bootstrap {n}" for n in sorted(bootstrap)),
            f"--config {config_dir}",
        ]
    )


def _init_on_other_ports(config: ClusterConfig, config_dir: Path, *, brand_new: bool) -> str:
    """For a cluster no node has started yet, laid out as `cluster init` lays it out (every
    cluster it makes gets the same default ports, so a second one collides with the first):
    the `cluster init --force` that moves it to other ports, keeping its id and secrets."""
    hosts = {n.host for n in config.nodes}
    base = config.nodes[0].raft_port - config.nodes[0].id
    if (
        not brand_new
        or len(hosts) != 1
        or config.nodes != node_layout(len(config.nodes), host=next(iter(hosts)), base_port=base)
    ):
        return ""
    other = base + 1000 if base + 1000 + METRICS_PORT_OFFSET + NODES_MAX <= 65535 else base - 1000
    command = (
        f"metastore cluster init {shlex.quote(str(config_dir))} --nodes {len(config.nodes)} "
        f"--host {next(iter(hosts))} --cluster-id {shlex.quote(config.cluster_id)} "
        f"--base-port {other}{' --tls' if config.tls is not None else ''} "
        "--force"
    )
    return (
        f" (no node has started yet: `{command}` rewrites its files on ports {other}+N, "
        "keeping its secrets; redo any edits of them)"
    )


def _nodes_to_bootstrap(
    config: ClusterConfig,
    config_dir: Path,
    to_start: list[int],
    asked: set[int],
    *,
    only_missing: bool,
) -> set[int]:
    """Which of `to_start` start as a first start (`node start --bootstrap`).

    Every node of a brand-new cluster (none has state). Otherwise only those named by
    --bootstrap: a node without state among nodes with state either never ran (its first
    start was interrupted or failed: bootstrapping it is its first start) or lost its data
    (it may have voted in terms it no longer remembers: it must be removed and added back),
    and only the user can tell. Refused, before anything starts: a node without state that
    is not named (the error gives the command to run), a named one that has state or is not
    being started."""
    stateless = {
        n.id for n in config.nodes if not processes.node_has_state(config.node_data_dir(n.id))
    }
    wrong = sorted(asked - set(to_start))
    if wrong:
        raise CliError(
            "USAGE",
            f"--bootstrap {wrong[0]}: node {wrong[0]} is "
            + ("running" if wrong[0] in {n.id for n in config.nodes} else "not in the cluster")
            + "; --bootstrap names nodes this command starts",
            exit_code=EXIT_USAGE,
        )
    with_state = sorted(asked - stateless)
    if with_state:
        node_id = with_state[0]
        raise CliError(
            "USAGE",
            f"--bootstrap {node_id}: node {node_id} already has state in "
            f"{config.node_data_dir(node_id)} (it started before); start it without --bootstrap",
            exit_code=EXIT_USAGE,
        )
    if len(stateless) == len(config.nodes):
        return set(to_start)  # a brand-new cluster
    unnamed = sorted((stateless & set(to_start)) - asked)
    if unnamed:
        others = sorted(n.id for n in config.nodes if n.id not in stateless)
        nodes = ", ".join(map(str, unnamed))
        dirs = ", ".join(str(config.node_data_dir(n)) for n in unnamed)
        command = _up_command(config_dir, missing=only_missing, bootstrap=[*asked, *unnamed])
        lost_quorum = ""
        if len(others) <= len(config.nodes) // 2:
            # Removing and adding members back commits through the log: the nodes with state
            # cannot, being no majority. What they hold can still be saved and restored.
            survivor = config.node_data_dir(others[0])
            lost_quorum = (
                f". With only {len(others)} of {len(config.nodes)} nodes holding state the "
                "cluster has no quorum to remove them: if their data is lost for good, stop "
                f"the survivor(s), save the catalog with `metastore snapshot save FILE "
                f"--data-dir {survivor}` and restore it into a new cluster (`metastore "
                'snapshot restore FILE --config NEW_DIR`; docs/operations.md, "Losing quorum")'
            )
        raise CliError(
            "NOT_BOOTSTRAPPED",
            f"node(s) {nodes} have no state ({dirs}: no identity, empty log) while node(s) "
            f"{', '.join(map(str, others))} have: nothing was started. If their first start "
            "did not complete (`cluster up` was interrupted, or they failed at their first "
            f"start: see node.log there), start them as a first start: {command} . If their "
            "data was lost, do not: they may have voted in terms they no longer remember; "
            "remove them (`metastore cluster remove-node N`) and add them back "
            "(`metastore cluster add-node N HOST:PORT`), then start them with --bootstrap"
            + lost_quorum,
            exit_code=EXIT_REFUSED,
            details={"nodes": unnamed, "command": command},
        )
    return asked & set(to_start)


def _interrupted(
    config_dir: Path,
    started: list[processes.StartedNode],
    to_start: list[int],
    bootstrap: set[int],
) -> CliError:
    """Ctrl-C during `cluster up`: the nodes started keep running (their own sessions); say
    which, and the commands that go on from here (the rest start as this run would have)."""
    done = {s.node_id for s in started}
    rest = [n for n in to_start if n not in done]
    running = ", ".join(f"node {s.node_id} (pid {s.pid})" for s in started) or "no node"
    text = f"interrupted: {running} started and keep(s) running in the background"
    if rest:
        command = _up_command(
            config_dir, missing=True, bootstrap=[n for n in rest if n in bootstrap]
        )
        text += f"; node(s) {', '.join(map(str, rest))} not started: start them with {command}"
    text += (
        f". `metastore cluster status` shows the nodes; `metastore cluster down --config "
        f"{config_dir}` stops them"
    )
    return CliError("INTERRUPTED", text, exit_code=EXIT_GENERIC)


def _wait_for_leader(
    client: SyncMetastoreClient,
    started: list[processes.StartedNode],
    config: ClusterConfig,
    wait_ms: int,
    token_source: str,
) -> list[EndpointResult]:
    begin = time.monotonic()
    deadline = begin + wait_ms / 1000
    shown = ""
    while True:
        results = client.status_all()
        _refuse_a_refused_token(results, config, token_source)
        # Ready and initialized: a new cluster's first leader proposes InitCluster a moment
        # after it is elected, and a DDL applied before it is refused (CLUSTER_NOT_INITIALIZED),
        # so `cluster up && metastore sql ...` must not return before it.
        ready = {
            r.result.get("node_id"): r.result.get("role")
            for r in results
            if r.result is not None and r.result.get("ready") and r.result.get("initialized")
        }
        # A restarted node is only back once it serves reads again, not when some leader does.
        if "leader" in ready.values() and all(s.node_id in ready for s in started):
            end_progress()
            return results
        dead = [s for s in started if s.process.poll() is not None]
        if dead:
            end_progress()
            first = dead[0]
            tail = processes.log_tail(first.log_file)
            raise CliError(
                "NODE_EXITED",
                f"node {first.node_id} (pid {first.pid}) exited with code "
                f"{first.process.returncode}; see {first.log_file}. Stop the others with: "
                f"metastore cluster down --config {config.path.parent}"
                + (f"\n--- last lines of {first.log_file} ---\n{tail}" if tail else ""),
            )
        elapsed_s = time.monotonic() - begin
        if time.monotonic() >= deadline:
            end_progress()
            raise CliError(
                "NOT_READY",
                f"no ready leader, or a started node not ready, after {elapsed_s:.1f} s; "
                "node logs: " + ", ".join(str(s.log_file) for s in started),
                exit_code=EXIT_UNAVAILABLE,
                details={"status": _short_status(results)},
            )
        short = _short_status(results)
        progress(f"waiting for a ready leader ({elapsed_s:.1f} s): {short}", changed=short != shown)
        shown = short
        time.sleep(UP_POLL_INTERVAL_MS / 1000)


def _refuse_a_refused_token(
    results: list[EndpointResult], config: ClusterConfig, token_source: str
) -> None:
    """A node reads its tokens when it starts, so one that refuses the token now refuses it
    for good: say so at once rather than wait out --wait and answer NOT_READY."""
    refused = [
        r.endpoint
        for r in results
        if r.error is not None and r.error.code is ErrorCode.UNAUTHENTICATED
    ]
    if not refused:
        return
    end_progress()
    raise CliError(
        ErrorCode.UNAUTHENTICATED.value,
        f"{', '.join(refused)} refused the token of {token_source}: it is not one of cluster "
        f"{config.cluster_id!r}'s (its admin token: "
        f"{config.secrets_dir / token_file_name(Role.ADMIN)}). The nodes keep running; "
        f"`metastore cluster status --config {config.path.parent}` asks them with that token, "
        f"`metastore cluster down --config {config.path.parent}` stops them",
        exit_code=EXIT_AUTH,
    )


def _short_status(results: list[EndpointResult]) -> str:
    parts = []
    for r in results:
        if r.result is not None:
            if not r.result.get("ready"):
                ready = "not ready"
            elif not r.result.get("initialized"):
                ready = "ready, cluster not initialized yet"
            else:
                ready = "ready"
            parts.append(f"{r.endpoint} {r.result.get('role')} {ready}")
        elif r.error is not None:
            parts.append(f"{r.endpoint} {r.error.code.value}")
    return ", ".join(parts)


@cluster.command("down")
@_config_dir_option
@click.option(
    "--grace-ms",
    type=click.IntRange(0, processes.STOP_GRACE_MS_MAX),
    default=processes.STOP_GRACE_MS_DEFAULT,
    help="Time between SIGINT and SIGKILL.",
)
@click.pass_context
def cluster_down(ctx: click.Context, config_dir: Path, grace_ms: int) -> None:
    """Stop the nodes started by `cluster up`: SIGINT to the PID in each pid file, then
    SIGKILL after --grace-ms. Pid files are removed. Processes are never looked up by name, and
    a PID whose command line is not a node of this cluster is never signalled. Exits 1 if a
    node is still running or its pid file cannot be read (after stopping the others).

    SIGINT stops a node at once. SIGTERM (`kill PID`, a service manager) is the stop of one
    node (a rolling restart): a leader first hands leadership to another voter, waiting up to
    one election timeout, which cannot succeed while all nodes stop.

    \b
    Example:
      metastore cluster down --config cluster_configs/mycluster
    """
    a = app(ctx)
    config = load_cluster_config(config_dir / CLUSTER_FILE_NAME)
    with processes.lifecycle_lock(config.data_dir, "cluster down"):
        results = processes.stop_nodes(
            {n.id: config.node_pid_file(n.id) for n in config.nodes},
            config_dir=config_dir,
            grace_ms=grace_ms,
        )
    doc = [{"node_id": r.node_id, "pid": r.pid, "outcome": r.outcome} for r in results]
    rows = [[r.node_id, r.pid, r.outcome] for r in results]
    emit(a.output, doc, lambda: [rows_table(["node", "pid", "outcome"], rows)])
    if any(
        r.outcome == "still running" or r.outcome.startswith(processes.PID_FILE_UNREADABLE)
        for r in results
    ):
        ctx.exit(1)


# ---- status ----------------------------------------------------------------------------------


@cluster.command("status")
@config_dir_option
@click.pass_context
def cluster_status(ctx: click.Context) -> None:
    """Ask every endpoint for its status: Raft role, term, leader, commit/applied index, safe
    time and its lag, and whether it is ready to serve; then, as the leader sees it, how far
    behind each member is and how much of a snapshot being sent to one has arrived (watch a
    node added with `add-node` catch up). Exits with 3 if any did not answer.
    With -o json each node also reports `revoked_certs`, how many TLS certificates it refuses
    (`cluster revoked` lists them).

    \b
    Example:
      metastore cluster status --config cluster_configs/mycluster
    """
    a = app(ctx)
    results = a.client().status_all()
    emit(
        a.output,
        endpoint_results_doc(results),
        lambda: [_status_table(results), *_replication_tables(results)],
    )
    if not all(r.ok for r in results):
        if nothing_listens([r.error for r in results if r.error is not None]):
            click.echo(nothing_listens_hint(a), err=True)
        ctx.exit(EXIT_UNAVAILABLE)


def _replication_tables(results: list[EndpointResult]) -> list[RenderableType]:
    """The leader's view of the other members: how far behind each is, and the progress of a
    snapshot being sent to one (adding a node to a large catalog spends its time there)."""
    tables: list[RenderableType] = []
    for r in results:
        replication = (r.result or {}).get("replication") or {}
        if not isinstance(replication, dict) or not replication:
            continue
        rows = []
        for node_id, p in sorted(replication.items(), key=lambda kv: int(kv[0])):
            total, acked = int(p.get("snapshot_bytes", 0)), int(p.get("snapshot_acked_bytes", 0))
            snapshot = (
                f"{acked / 2**20:,.1f} of {total / 2**20:,.1f} MiB ({100 * acked // total}%)"
                if total
                else "-"
            )
            rows.append(
                [
                    node_id,
                    "learner" if p.get("learner") else "voter",
                    p.get("match"),
                    p.get("behind"),
                    p.get("state"),
                    "yes" if p.get("active") else "no",
                    snapshot,
                ]
            )
        columns = ["node", "member", "match", "behind", "state", "answering", "snapshot sent"]
        title = f"replication, as leader {r.result.get('node_id') if r.result else '?'} sees it"
        tables.append(rows_table(columns, rows, title=title))
    return tables


def _leader_offset(status: dict[str, Any]) -> str:
    """The leader's clock minus this node's, as this node measured it (ms)."""
    if status.get("role") == "leader":
        return "0"
    offsets = status.get("clock_offsets_ms") or {}
    value = offsets.get(str(status.get("leader"))) if isinstance(offsets, dict) else None
    return "-" if value is None else f"{value:+d}"


def _clock_note(alarm: object) -> str:
    """A peer's Tm ran ahead of this node's clock beyond the allowed offset (raft.node)."""
    if not isinstance(alarm, dict) or not alarm:
        return ""
    return (
        f"clock: node {alarm.get('peer')} was {alarm.get('ahead_ms')} ms ahead of this node "
        "(one of the two clocks is wrong; check chrony/ntpd)"
    )


def _snapshot_note(error: object) -> str:
    """The node could not save its own snapshot (raft.node): it serves, its log grows."""
    return f"snapshot not saved (serving from its log): {error}" if error else ""


def _status_table(results: list[EndpointResult]) -> RenderableType:
    rows = []
    for r in results:
        if r.result is not None:
            s = r.result
            rows.append(
                [
                    r.endpoint,
                    s.get("node_id"),
                    s.get("role"),
                    s.get("term"),
                    s.get("leader"),
                    f"{s.get('commit_index')}/{s.get('applied_index')}",
                    ts_cell(s.get("safe_time")),
                    safe_time_lag_cell(s),
                    _leader_offset(s),
                    s.get("ready"),
                    s.get("clock_fenced")
                    or _snapshot_note(s.get("snapshot_save_error"))
                    or _clock_note(s.get("clock_alarm")),
                ]
            )
        elif r.error is not None:
            # "check that the cluster is up" tells nothing to whoever reads `cluster status`.
            message = r.error.message.removesuffix(f"; {CHECK_CLUSTER_HINT}")
            error = f"{r.error.code.value}: {message}"
            rows.append([r.endpoint, None, None, None, None, None, "-", None, None, None, error])
    columns = [
        "endpoint",
        "node",
        "role",
        "term",
        "leader",
        "commit/applied",
        "safe time",
        "lag ms",
        "clock vs leader ms",
        "ready",
        "error",
    ]
    return rows_table(columns, rows)


# ---- membership ------------------------------------------------------------------------------


def _membership_result(a: App, result: dict[str, Any]) -> None:
    """The reply: whole with -o json; as a table, its `warning` (a long sentence) goes to
    stderr as its own line instead of widening every row of the table."""
    warning = result.get("warning")
    if a.output != "json" and isinstance(warning, str):
        shown = {k: v for k, v in result.items() if k != "warning"}
        emit(a.output, result, lambda: [kv_table(shown)])
        click.echo(f"warning: {warning}", err=True)
        return
    emit(a.output, result, lambda: [kv_table(result)])


def _membership_change(change: str, node_id: int, call: Callable[[], dict[str, Any]]) -> Any:
    """Run a membership `call`; a timeout (or a lost answer) says the change's outcome is
    unknown and how to find it out, instead of reading like "nothing happened": the leader
    may have appended the change, which then commits (or already did) on its own."""
    try:
        return call()
    except MetastoreError as exc:
        if not _outcome_unknown(exc):
            raise
        # Its own, fuller advice replaces the library's general one.
        message = exc.message.removesuffix(f"; {MEMBERSHIP_OUTCOME_HINT}")
        raise CliError(
            exc.code.value,
            f"{message}. The {change} of node {node_id} may still take effect, or already "
            "has: its outcome is unknown. Check with `metastore cluster status -o json` "
            "(`voters` and `learners` of the leader) before running it again: a change the "
            "leader appended counts at once and commits when a majority of the new voters "
            "answer",
            exit_code=EXIT_UNAVAILABLE,
            details={**exc.details, "outcome_unknown": True, "node_id": node_id},
        ) from None


def _outcome_unknown(exc: MetastoreError) -> bool:
    """The request may have been executed: a timeout (the client's or the leader's), or an
    answer lost after the request was sent (UNAVAILABLE marked so by the client or the
    forwarding node). Not a deadline the client saw pass before the request could have
    reached any node (NotAppliedTimeoutError: nothing to look for)."""
    if exc.code is ErrorCode.TIMEOUT:
        return exc.details.get("not_applied") is not True
    return exc.code is ErrorCode.UNAVAILABLE and exc.details.get("outcome_unknown") is True


def _membership_timeout_ms(a: App) -> int:
    """--timeout-ms as the leader's wait for a membership change to commit (the protocol's
    bound at most); the call itself waits a little longer, for the leader's answer."""
    return min(a.timeout_ms, REQUEST_TIMEOUT_MS_MAX)


@cluster.command("add-node")
@click.argument("node_id", type=click.IntRange(1, NODE_ID_MAX))
@click.argument("raft_addr", metavar="RAFT_ADDR")
@click.option("--voter", is_flag=True, help="Add as a voter at once instead of as a learner.")
@click.option(
    "--client-address",
    metavar="HOST:PORT",
    default=None,
    help="The new node's client port (its client_port in its config). Recorded through the "
    "log, so every member can forward requests to it once it leads. Default: its [[nodes]] "
    "entry in the cluster.toml this command talks through (--config DIR, or the local one), "
    "else the leader's cluster.toml entry.",
)
@config_dir_option
@click.pass_context
def cluster_add_node(
    ctx: click.Context, node_id: int, raft_addr: str, voter: bool, client_address: str | None
) -> None:
    """Add node NODE_ID, whose Raft peer address is RAFT_ADDR (host:port).

    By default it joins as a learner (receives the log, does not vote); promote it with
    `cluster promote-node` once it has caught up.

    Members forward writes and DDL to the leader's client port, and Raft knows only peer
    ports: the new node's client address (--client-address, or its cluster.toml entry) is
    recorded through the log, so the members reach it once it leads without editing their
    cluster.toml or restarting. Where a cluster.toml names the node, --client-address must
    agree with it. Without any address (or before `cluster version --finalize` reached apply
    version 6) it joins unrecorded and the reply's `warning` says what to do. Run add-node
    again with --client-address for a member already in: it records the address only.

    The new node needs its own config naming it (its [[nodes]] entry in its cluster.toml, a
    nodeN.toml) and the cluster's secrets_dir. After add-node, start it once as a first start
    (its data directory is empty): `metastore cluster up --missing --bootstrap N --config DIR`
    on one host, or `metastore node start --config nodeN.toml --bootstrap`.

    \b
    Example:
      metastore cluster add-node 4 host4:24104 --client-address host4:24204
    """
    a = app(ctx)
    client_address = _new_member_client_address(a, node_id, client_address)
    timeout_ms = _membership_timeout_ms(a)
    result = _membership_change(
        "addition",
        node_id,
        lambda: a.client().add_node(
            node_id,
            raft_addr,
            learner=not voter,
            timeout_ms=timeout_ms,
            client_address=client_address,
        ),
    )
    _membership_result(a, result)


def _new_member_client_address(a: App, node_id: int, given: str | None) -> str | None:
    """--client-address (checked), else the node's entry in the cluster.toml this command
    talks through; an entry there wins: a --client-address that disagrees is refused."""
    parsed = None
    if given is not None:
        try:
            parsed = parse_endpoint(given)
        except InvalidArgumentError as exc:
            raise CliError(
                "USAGE", f"--client-address: {exc.message}", exit_code=EXIT_USAGE
            ) from None
    config = a.talking_through_config()
    entry = next((n for n in config.nodes if n.id == node_id), None) if config else None
    if entry is None:
        return given
    if parsed is not None and parsed != (entry.host, entry.client_port):
        raise CliError(
            "USAGE",
            f"--client-address {given} disagrees with node {node_id}'s entry in "
            f"{a.endpoints_source()} ({entry.client_address}): give that address, or none",
            exit_code=EXIT_USAGE,
        )
    return entry.client_address


@cluster.command("promote-node")
@click.argument("node_id", type=click.IntRange(1, NODE_ID_MAX))
@config_dir_option
@click.option(
    "--wait",
    "wait",
    type=WAIT_DURATION,
    default="0",
    show_default=True,
    help="While the learner has not caught up, retry for up to this long (30s, 10m, at most "
    "24h; a bare number is seconds), showing on stderr how far it is (a snapshot being "
    "received, entries behind). 0: ask once.",
)
@click.pass_context
def cluster_promote_node(ctx: click.Context, node_id: int, wait: str) -> None:
    """Make learner NODE_ID a voter. Refused (exit 5) until the learner has caught up with the
    leader's log: a voter far behind could not help reach a quorum. `cluster status` shows how
    far each node is; `--wait 10m` retries until it has caught up (a new node of a large
    catalog first receives a snapshot).

    \b
    Example:
      metastore cluster promote-node 4 --wait 10m
    """
    a = app(ctx)
    client = a.client()
    wait_ms = parse_wait_ms(wait)
    deadline = time.monotonic() + wait_ms / 1000
    waited = False
    try:
        while True:
            try:
                result = _membership_change(
                    "promotion",
                    node_id,
                    lambda: client.promote_node(node_id, timeout_ms=_membership_timeout_ms(a)),
                )
                break
            except MetastoreError as exc:
                behind = exc.details.get("reason") == "learner_behind"
                if not behind or time.monotonic() >= deadline:
                    raise
                waited = True
                progress(_catch_up_text(client, node_id, exc), changed=True)
                time.sleep(PROMOTE_RETRY_S)
    finally:
        if waited:
            end_progress()
    _membership_result(a, result)


# How often `promote-node --wait` asks again while the learner catches up.
PROMOTE_RETRY_S: Final = 1.0


def _catch_up_text(client: SyncMetastoreClient, node_id: int, refusal: MetastoreError) -> str:
    """One progress line for a learner catching up: the leader's view of it if a node answers
    as leader, else what the refusal said."""
    view: dict[str, Any] = {}
    for r in client.status_all():
        replication = (r.result or {}).get("replication") or {}
        if isinstance(replication, dict) and str(node_id) in replication:
            view = replication[str(node_id)]
            break
    total, acked = int(view.get("snapshot_bytes", 0)), int(view.get("snapshot_acked_bytes", 0))
    if total:
        return (
            f"node {node_id}: receiving a snapshot, {acked / 2**20:,.1f} of "
            f"{total / 2**20:,.1f} MiB ({100 * acked // total}%)"
        )
    match = view.get("match", refusal.details.get("match"))
    commit = refusal.details.get("commit_index")
    behind = view.get("behind")
    if behind is None and isinstance(match, int) and isinstance(commit, int):
        behind = max(0, commit - match)
    return f"node {node_id}: catching up, holds entries up to {match} ({behind} behind)"


@cluster.command("remove-node")
@click.argument("node_id", type=click.IntRange(1, NODE_ID_MAX))
@config_dir_option
@click.pass_context
def cluster_remove_node(ctx: click.Context, node_id: int) -> None:
    """Remove NODE_ID from the cluster (one member at a time).

    The removed node's process keeps running until you stop it (`cluster down --config DIR`
    does, if `cluster up` started it); once it has applied its removal it answers NOT_READY,
    so clients that still list it go to another endpoint.

    With TLS, the certificate(s) NODE_ID presented to the leader or the other members on peer
    links are then revoked cluster-wide (`revoked` in the reply; `cluster revoked` lists
    them): to add the node id back later, give it a new certificate (`cluster certs --ca-dir
    CA_DIR --node NODE_ID --out NEW_DIR`) and a fresh data directory. If no member saw its
    certificate (it was down since they started), the reply says so: revoke the file with
    `cluster revoke-cert`.

    --timeout-ms bounds the leader's wait for the change to commit (at most 60 s); the
    certificate steps around it may add up to 19 s. If it times out (say, the remaining
    voters' majority does not answer), the removal may still take effect: the error says its
    outcome is unknown (exit 3); check `cluster status -o json` before running it again.

    \b
    Example:
      metastore cluster remove-node 3 --config cluster_configs/mycluster
    """
    a = app(ctx)
    timeout_ms = _membership_timeout_ms(a)
    result = _membership_change(
        "removal", node_id, lambda: a.client().remove_node(node_id, timeout_ms=timeout_ms)
    )
    _membership_result(a, result)


@cluster.command("revoke-cert")
@click.argument(
    "cert_file", required=False, type=click.Path(dir_okay=False, path_type=Path), metavar="[FILE]"
)
@click.option(
    "--fingerprint",
    default=None,
    help="The certificate's SHA-256 fingerprint instead of its file (64 hex digits; colons "
    "and a 'sha256:' prefix are accepted).",
)
@click.option(
    "--node-id",
    type=click.IntRange(1, NODE_ID_MAX),
    default=None,
    help="The node the certificate belongs to (recorded with the revocation).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Revoke it even though a member presents it right now (that member is cut off at "
    "once: for a leaked key that cannot wait for the member's restart).",
)
@click.option("--request-id", help=REQUEST_ID_HELP)
@config_dir_option
@click.pass_context
def cluster_revoke_cert(
    ctx: click.Context,
    cert_file: Path | None,
    fingerprint: str | None,
    node_id: int | None,
    force: bool,
    request_id: str | None,
) -> None:
    """Revoke a TLS certificate cluster-wide: every node refuses it on peer links (both
    directions) and on client ports, and closes open connections that use it. Give the PEM
    FILE (its first certificate counts) or --fingerprint. Admin only; audited; permanent.

    `cluster remove-node` revokes the removed node's certificate by itself; use this for a
    leaked certificate of a current member (rotation: `cluster certs --ca-dir ... --node N
    --out NEW_DIR`, restart node N on the new certificate, then revoke the old one). A
    certificate a member presents on a live link is refused (exit 5) unless --force: revoking
    it cuts that member off at once. Without TLS there is no per-node identity to revoke
    (every member shares the cluster secret). `cluster revoked` lists what is revoked.

    Safe to repeat: a revocation is permanent, and its request id (--request-id, else a new
    one) is applied once, so an attempt whose outcome is unknown is asked again on another
    node, and the error of one that stays unknown prints the command that settles it.

    \b
    Examples:
      metastore cluster revoke-cert tls/node-3.crt --node-id 3
      metastore cluster revoke-cert --fingerprint 5f:3a:...
    """
    from metastore.revocation import fingerprint_of_pem, normalize_fingerprint

    a = app(ctx)
    if (cert_file is None) == (fingerprint is None):
        raise CliError("USAGE", "give exactly one of FILE and --fingerprint", exit_code=EXIT_USAGE)
    try:
        if cert_file is not None:
            try:
                pem = cert_file.read_bytes()
            except FileNotFoundError:
                raise CliError(
                    "FILE_NOT_FOUND", f"{cert_file}: no such file", exit_code=EXIT_NOT_FOUND
                ) from None
            except OSError as exc:
                raise CliError(
                    "FILE_UNREADABLE", f"{cert_file}: {exc.strerror}", exit_code=EXIT_USAGE
                ) from None
            fp = fingerprint_of_pem(pem)
        else:
            assert fingerprint is not None
            fp = normalize_fingerprint(fingerprint)
    except MetastoreError as exc:
        raise CliError("INVALID_ARGUMENT", exc.message, exit_code=EXIT_USAGE) from None
    with settle_unknown_outcome():
        result = a.client().revoke_cert(
            fp, node_id=node_id or 0, force=force, request_id=request_id
        )
    emit(a.output, result, lambda: [kv_table(result)])


@cluster.command("revoked")
@config_dir_option
@click.pass_context
def cluster_revoked(ctx: click.Context) -> None:
    """List the revoked TLS certificates (fingerprint, node, why, by whom, when), this node's
    own certificate, and the certificates each peer presented to this node (what
    `remove-node` would revoke).

    \b
    Example:
      metastore cluster revoked -o json
    """
    a = app(ctx)
    doc = a.client().revoked_certs()
    rows = [
        [r["fingerprint"], r["node_id"] or "-", r["reason"], r["by"], ts_cell(r["tm"])]
        for r in doc.get("revoked", [])
    ]
    me = doc.get("this_node", {})
    seen = {f"node {n} presented": ", ".join(fps) or "-" for n, fps in doc["peers_seen"].items()}
    emit(
        a.output,
        doc,
        lambda: [
            rows_table(
                ["fingerprint (sha256)", "node", "reason", "by", "revoked at"],
                rows,
                title=f"{doc.get('count', 0)} revoked certificate(s)",
            ),
            kv_table(
                {
                    f"this node ({me.get('node_id')})": me.get("fingerprint") or "(no TLS)",
                    "this node's certificate revoked": me.get("revoked"),
                    **seen,
                }
            ),
        ],
    )


@cluster.command("transfer-leader")
@click.argument("node_id", type=click.IntRange(1, NODE_ID_MAX))
@config_dir_option
@click.pass_context
def cluster_transfer_leader(ctx: click.Context, node_id: int) -> None:
    """Hand leadership to voter NODE_ID (e.g. to move it off a host).

    A leader stopped on its own with SIGTERM (a service manager's stop) hands leadership to the
    most caught-up voter by itself first, so a rolling restart needs no transfer (SIGINT, as
    `cluster down` sends, stops it without).

    \b
    Example:
      metastore cluster transfer-leader 2
    """
    a = app(ctx)
    _membership_result(a, a.client().transfer_leader(node_id))


@cluster.command("version")
@config_dir_option
@click.option(
    "--finalize",
    is_flag=True,
    help="Move the cluster's apply version to the newest every member's release supports "
    "(the last step of an upgrade; admin only; never moves back).",
)
@click.option(
    "--to",
    "to_version",
    type=click.IntRange(1, MAX_APPLY_VERSION),
    default=None,
    help="With --finalize: move to this version instead (every member must support it).",
)
@click.pass_context
def cluster_version(ctx: click.Context, finalize: bool, to_version: int | None) -> None:
    """Show the cluster's apply version (the rules every node applies the log with) and the
    newest each member's release supports; with --finalize, move it forward.

    \b
    Upgrading a cluster:
      1. replace the release on one node at a time and restart it (the cluster keeps the
         old rules meanwhile, so old and new nodes agree on every entry);
      2. once every member runs the new release: metastore cluster version --finalize.
    A node whose release is older than the cluster's apply version stops with a clear error
    instead of applying the log differently; upgrade it and it resumes from its log.

    \b
    Examples:
      metastore cluster version
      metastore cluster version --finalize
    """
    a = app(ctx)
    if to_version is not None and not finalize:
        raise CliError("USAGE", "--to needs --finalize", exit_code=EXIT_USAGE)
    client = a.client()
    doc = client.finalize_apply_version(to_version) if finalize else client.apply_version()
    members = doc.get("members", [])
    rows = [[m["node_id"], m["supported"] or "-", m["error"] or "-"] for m in members]
    summary: dict[str, Any] = {"apply version": doc.get("apply_version")}
    if finalize:
        summary["changed"] = doc.get("changed")
        summary["previous"] = doc.get("previous")
    else:
        finalizable = doc.get("finalizable")
        summary["--finalize would move to"] = (
            "(a member did not answer)" if finalizable is None else finalizable
        )
    emit(
        a.output,
        doc,
        lambda: [
            kv_table(summary),
            rows_table(["node", "supports up to", "error"], rows, title="members' releases"),
        ],
    )
