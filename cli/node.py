"""`metastore node start`: run one node in the foreground."""

from __future__ import annotations

from pathlib import Path

import click

from cli.errors import CliError
from metastore.daemon.config import load_node_config

# The module the daemon lives in; imported only when a node is started so every other command
# works without it (and without its dependencies being importable).
DAEMON_MODULE = "metastore.daemon.node"


@click.group("node")
def node() -> None:
    """Run a node of the cluster (normally via `metastore cluster up` or a service manager)."""


@node.command("start")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A node file (nodeN.toml), or a cluster file (cluster.toml) together with --node-id.",
)
@click.option(
    "--node-id", type=click.IntRange(min=1), help="Which member to run (with a cluster file)."
)
@click.option(
    "--bootstrap",
    is_flag=True,
    help="First start of this member of a new cluster: create its identity in its (empty) data "
    "directory. Never use it to restart a member whose data was lost.",
)
@click.pass_context
def node_start(ctx: click.Context, config_path: Path, node_id: int | None, bootstrap: bool) -> None:
    """Run one node in the foreground until SIGTERM or SIGINT (Ctrl-C).

    On SIGTERM (a rolling restart, a service manager's stop) a leader first hands leadership to
    the most caught-up voter, waiting up to one election timeout; SIGINT stops at once (as
    `cluster down` does for a whole cluster) and cuts a hand-over in progress short.

    The configuration is validated before anything starts. Secrets are created on first start
    in the cluster's secrets_dir (0700, files 0600). A node whose data directory is empty
    refuses to start (exit 2) unless --bootstrap: a member that lost its data may have voted in
    terms it no longer remembers, so it must be removed from the cluster and added back rather
    than restarted fresh. `metastore cluster up` passes --bootstrap to a brand-new cluster's
    nodes, and to those named by its own --bootstrap (a first start that did not complete).

    \b
    Example:
      metastore node start --config cluster_configs/local/node1.toml
    """
    # Validate first: a bad config is reported the same way whether or not the daemon exists.
    load_node_config(config_path, node_id)
    try:
        from metastore.daemon.node import run_node  # lazily: see DAEMON_MODULE
    except ModuleNotFoundError as exc:
        if exc.name not in (DAEMON_MODULE, "metastore.daemon"):
            raise
        raise CliError(
            "DAEMON_UNAVAILABLE",
            f"this build has no metastore daemon ({DAEMON_MODULE}.run_node is missing); "
            "the node cannot start",
        ) from None
    ctx.exit(run_node(config_path, node_id, bootstrap=bootstrap))
