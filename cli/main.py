"""`metastore`: the command line of the schema metastore, shaped like etcdctl.

Nouns and verbs (`metastore cluster status`, `metastore table describe sales.orders`), global
flags that each also come from a `METASTORE_*` environment variable, `-o table|json`, one
`Error: <CODE>: <message>` line on stderr (with `-o json`, followed by the error as a JSON
document) and an exit code by kind of failure (cli.errors).

Global flags may come before or after the sub-command (`metastore -o json table list` and
`metastore table list -o json` are the same), as etcdctl's persistent flags do: every command
gets a hidden copy of each, which overrides the value given before it or by the environment.

Every command parses its arguments, calls `metastore.client` (or, for the local cluster's
lifecycle, `metastore.daemon.config` / `.secrets` and cli.processes) and prints; logic that
clients other than the CLI could need belongs in the library, not here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click
from click.exceptions import NoArgsIsHelpError

from cli.cluster import cluster
from cli.context import App, app, nothing_listens, nothing_listens_hint
from cli.errors import (
    EXIT_CODES_HELP,
    EXIT_USAGE,
    CliError,
    exit_code_for,
    fail,
    fail_usage,
)
from cli.gc import gc, pts
from cli.job import job
from cli.job_backfill import run_backfill
from cli.leases import lease, session
from cli.node import node
from cli.ns import ns
from cli.output import OUTPUT_FORMATS, ts_cell
from cli.safe_time import safe_time
from cli.snapshot import snapshot
from cli.sql import sql
from cli.table import table
from cli.table_compact import table_compact
from cli.table_data import table_files, table_read
from cli.table_optimize import table_optimize
from cli.txn import txn
from cli.watch import watch
from hlc import HlcError, span_text
from metastore.client import DEFAULT_TIMEOUT_MS, TIMEOUT_MS_MAX
from metastore.client.protocol import CHECK_CLUSTER_HINT
from metastore.daemon.config import CLUSTER_FILE_NAME, ConfigError
from metastore.daemon.secrets import SecretsError
from metastore.errors import ErrorCode, MetastoreError
from metastore.limits import MAX_CLOCK_SKEW_MS
from raft.oserror import os_error_text
from raft.wal import WalError

CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
    "show_default": True,
}

EPILOG = (
    "Examples (on the 3-node cluster the repository ships in cluster_configs/local, which\n"
    "commands use by default; `metastore cluster init DIR` makes another):\n\n"
    "\b\n"
    "  metastore cluster up\n"
    "  metastore cluster status -o json\n"
    "  metastore table list -o json\n"
    '  metastore sql "CREATE NAMESPACE sales"\n'
    '  metastore sql "CREATE TABLE sales.orders (id BIGINT NOT NULL, amount DECIMAL(10,2))"\n'
    "  metastore table describe sales.orders --as-of -5m\n"
    "  metastore table read sales.orders --as-of 2026-11-22T10:00:00Z --limit 5\n"
    "  metastore txn log --limit 10\n"
    "  metastore job list --all\n"
    "  metastore cluster down\n\n" + EXIT_CODES_HELP
)


def _asks_for_json(args: list[str]) -> bool:
    """Whether the command line (or METASTORE_OUTPUT) asks for -o json, for an error found
    before the options that say so were parsed; the last one given counts, as for click."""
    output = os.environ.get("METASTORE_OUTPUT")
    for i, word in enumerate(args):
        if word in ("-o", "--output") and i + 1 < len(args):
            output = args[i + 1]
        elif word.startswith("--output="):
            output = word.split("=", 1)[1]
        elif word.startswith("-o") and len(word) > 2:
            output = word[2:]
    return output == "json"


class RootGroup(click.Group):
    """Turns every typed error of a sub-command, and every usage error click finds (in the root
    options, or in a sub-command's), into one stderr line and its exit code."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        given = list(args)  # click consumes `args` as it parses
        try:
            return super().make_context(info_name, args, parent, **extra)
        except NoArgsIsHelpError:
            raise  # `metastore` alone: the help, as click prints it
        except click.UsageError as exc:
            # The global options did not parse, so -o json is looked for in the words given.
            fail_usage(exc, as_json=parent is None and _asks_for_json(given))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise  # `metastore table` alone: that group's help
        except click.UsageError as exc:
            fail_usage(exc)
        except MetastoreError as exc:
            if exc.code is ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK:
                message, details = _timestamp_ahead(exc)
                fail(exc.code.value, message, exit_code_for(exc), details)
            fail(exc.code.value, _with_hint(ctx, exc), exit_code_for(exc), exc.details)
        except ConfigError as exc:
            fail(exc.code, _config_hint(exc), EXIT_USAGE, None)
        except SecretsError as exc:  # a token file or secrets directory: configuration
            fail(exc.code, str(exc), EXIT_USAGE, None)
        except CliError as exc:
            fail(exc.code, exc.message, exc.exit_code, exc.details)
        except HlcError as exc:
            fail(exc.code, str(exc), EXIT_USAGE, None)
        except WalError as exc:
            # A log this command writes or reads on this machine (`snapshot restore`): a full
            # or failing disk, named with its file and errno, not a traceback.
            fail(exc.code.upper(), str(exc), 1, None)
        except BrokenPipeError:
            raise  # stdout closed by its reader (`| head`): click exits quietly
        except OSError as exc:
            # A file or directory the command reads or writes: say which and why, not where in
            # the code (a directory under a file, no space left, no permission).
            fail("IO_ERROR", os_error_text(exc), 1, None)


def _with_hint(ctx: click.Context, error: MetastoreError) -> str:
    """The error's message, with what the node cannot know and the CLI can: for a token the
    cluster does not accept, which token was sent (a token of another cluster, from an old
    export, is the usual cause); for a token whose role is too weak, which token and where the
    stronger ones are; when no endpoint accepted a connection, where the endpoints
    came from (a cluster not started, or the ports of another one)."""
    a = ctx.find_object(App)
    if a is None:
        return error.message
    source = a.token_source()
    if error.code is ErrorCode.UNAUTHENTICATED and source is not None:
        return (
            f"{error.message} (is the token from {source} one of this cluster's? "
            "`metastore cluster init DIR` wrote them to DIR/secrets/)"
        )
    if error.code is ErrorCode.FORBIDDEN and source is not None:
        return (
            f"{error.message} (the token from {source} has a weaker role: use one of that role "
            "or admin; `metastore cluster init DIR` wrote DIR/secrets/writer.token and "
            "admin.token)"
        )
    if nothing_listens([error]):
        # Its own, more precise "is the cluster up?" replaces the library's general one.
        message = error.message.removesuffix(f"; {CHECK_CLUSTER_HINT}")
        return f"{message} ({nothing_listens_hint(a)})"
    return error.message


def _timestamp_ahead(error: MetastoreError) -> tuple[str, dict[str, object]]:
    """Every node refused a timestamp ahead of its clock: say by how much it is in the future
    and whether waiting helps, once, rather than each node's refusal again (the client tried
    them all and keeps each answer in `tried`, which said the same thing three times)."""
    ahead_ms, cs_max_ms, ts = (error.details.get(k) for k in ("ahead_ms", "cs_max_ms", "ts"))
    if not isinstance(ahead_ms, int) or not isinstance(cs_max_ms, int):
        return error.message, error.details  # an older node's shape: as it is
    when = ts_cell(ts) if isinstance(ts, int) else "the timestamp"
    if ahead_ms > MAX_CLOCK_SKEW_MS:
        advice = "far beyond any clock skew; check the time you asked for"
    else:
        advice = f"ask again in {span_text(max(0, ahead_ms - cs_max_ms))}"
    message = (
        f"{when} is in the future by {span_text(ahead_ms)} of the nodes' clocks, more than the "
        f"cluster's CSmax = {cs_max_ms} ms of tolerated clock skew: no node can answer for it "
        f"yet ({advice})"
    )
    return message, {"ahead_ms": ahead_ms, "cs_max_ms": cs_max_ms}


def _config_hint(error: ConfigError) -> str:
    """The error, and for a config directory with no cluster.toml (a typo, or a cluster not
    made yet: `snapshot restore` and `cluster up` need one), how to make one."""
    missing = error.key is None and not error.path.exists()
    if missing and error.path.name == CLUSTER_FILE_NAME:
        directory = error.path.parent
        return (
            f"{error}: no cluster is configured in {directory}; create one with `metastore "
            f"cluster init {directory}`, or pass --config with the directory of an existing one"
        )
    return str(error)


@click.group(cls=RootGroup, context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.option(
    "--endpoints",
    envvar="METASTORE_ENDPOINTS",
    show_envvar=True,
    metavar="HOST:PORT,...",
    help="Client addresses of the nodes. Default: the client ports in "
    "cluster_configs/local/cluster.toml (if that file exists here), or in DIR/cluster.toml "
    "for a command given --config DIR (cluster status, safe-time).",
)
@click.option(
    "--token",
    envvar="METASTORE_TOKEN",
    show_envvar=True,
    help="Bearer token (its role decides what you may do). Beats --token-file.",
)
@click.option(
    "--token-file",
    envvar="METASTORE_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File holding the token (mode 0600). Default: "
    "cluster_configs/local/secrets/admin.token if it exists.",
)
@click.option(
    "-o",
    "--output",
    envvar="METASTORE_OUTPUT",
    show_envvar=True,
    type=click.Choice(OUTPUT_FORMATS),
    default="table",
    help="Output format: rich tables, or one JSON document.",
)
@click.option(
    "--timeout-ms",
    envvar="METASTORE_TIMEOUT_MS",
    show_envvar=True,
    type=click.IntRange(1, TIMEOUT_MS_MAX),
    default=DEFAULT_TIMEOUT_MS,
    help="Time allowed for each request, failover and retries included.",
)
@click.option(
    "--cacert",
    envvar="METASTORE_CACERT",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Connect with TLS and trust this CA (PEM) for the nodes' certificates.",
)
@click.option(
    "--cert",
    envvar="METASTORE_CERT",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Client certificate (PEM), for client ports that require one; with --key.",
)
@click.option(
    "--key",
    envvar="METASTORE_KEY",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Private key (PEM) of --cert.",
)
@click.option(
    "--tls-server-name",
    envvar="METASTORE_TLS_SERVER_NAME",
    show_envvar=True,
    help="Verify the nodes' certificates against this name instead of each endpoint's host.",
)
@click.option(
    "--tls",
    envvar="METASTORE_TLS",
    show_envvar=True,
    is_flag=True,
    help="Connect with TLS, trusting the system's CAs (implied by --cacert/--cert/--key). "
    "Default: plaintext, or what [tls] of the local cluster.toml says.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    endpoints: str | None,
    token: str | None,
    token_file: Path | None,
    output: str,
    timeout_ms: int,
    cacert: Path | None,
    cert: Path | None,
    key: Path | None,
    tls_server_name: str | None,
    tls: bool,
) -> None:
    """Manage and query a Raft-replicated schema metastore.

    Every node answers "what is table T's schema at timestamp T" the same way. Timestamps
    (--as-of) may be HLC integers (epoch ms << 16; a plain epoch time in s, ms, µs or ns is
    refused with the ISO form meant), ISO-8601 times (2026-11-22T10:00:00Z), relative times
    (-5m, -2h) or now. The options below may also follow the sub-command, as in etcdctl
    (metastore table list -o json).
    """
    app = App(
        endpoints_option=endpoints,
        endpoints_explicit=(
            ctx.get_parameter_source("endpoints") is click.core.ParameterSource.COMMANDLINE
        ),
        token=token,
        token_explicit=ctx.get_parameter_source("token") is click.core.ParameterSource.COMMANDLINE,
        token_file=token_file,
        token_file_explicit=(
            ctx.get_parameter_source("token_file") is click.core.ParameterSource.COMMANDLINE
        ),
        output=output,
        timeout_ms=timeout_ms,
        tls=tls,
        cacert=cacert,
        cert=cert,
        key=key,
        tls_server_name=tls_server_name,
    )
    ctx.obj = app
    ctx.call_on_close(app.close)


# ---- global options after the sub-command -----------------------------------------------------

# Root option name -> the App field it sets.
GLOBAL_OPTION_FIELDS: Final = {
    "endpoints": "endpoints_option",
    "token": "token",
    "token_file": "token_file",
    "output": "output",
    "timeout_ms": "timeout_ms",
}


# App fields that record a global option was given as a flag (here, after the sub-command), not
# by its environment variable: the flag beats what a --config DIR supplies, the variable not.
EXPLICIT_FLAG_FIELDS: Final = {
    "endpoints_option": "endpoints_explicit",
    "token": "token_explicit",
    "token_file": "token_file_explicit",
}


def _set_global(field_name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is None or ctx.resilient_parsing:
            return  # not given here: the root's value (flag, environment or default) stands
        setattr(app(ctx), field_name, value)
        if field_name in EXPLICIT_FLAG_FIELDS:
            setattr(app(ctx), EXPLICIT_FLAG_FIELDS[field_name], True)

    return callback


def accept_global_options_after_subcommands(root: click.Group) -> None:
    """Give every command under `root` a hidden copy of each global option (no default, no
    environment variable: only an explicit flag there counts). A command with an option of the
    same name keeps its own (none has one today; tests/cli checks that every command accepts
    every global option)."""
    originals = [
        p for p in root.params if isinstance(p, click.Option) and p.name in GLOBAL_OPTION_FIELDS
    ]
    stack: list[click.Command] = list(root.commands.values())
    seen: set[int] = set()
    while stack:
        command = stack.pop()
        if id(command) in seen:
            continue
        seen.add(id(command))
        if isinstance(command, click.Group):
            stack.extend(command.commands.values())
        taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        for option in originals:
            if taken & set(option.opts) or option.name is None:
                continue
            command.params.append(
                click.Option(
                    option.opts,
                    type=option.type,
                    metavar=option.metavar,
                    hidden=True,
                    expose_value=False,
                    callback=_set_global(GLOBAL_OPTION_FIELDS[option.name]),
                    help=option.help,
                )
            )


cli.add_command(cluster)
cli.add_command(node)
cli.add_command(sql)
cli.add_command(table)
cli.add_command(ns)
cli.add_command(safe_time)
cli.add_command(txn)
cli.add_command(session)
cli.add_command(lease)
cli.add_command(pts)
cli.add_command(gc)
cli.add_command(snapshot)
cli.add_command(watch)
cli.add_command(job)
# The data commands live in their own module (they need pyarrow) but belong to the table noun.
table.add_command(table_files)
table.add_command(table_read)
# `table optimize` runs Spark in this process; pyspark is imported only when it runs.
table.add_command(table_optimize)
table.add_command(table_compact)
# `job run-backfill` runs Spark in this process; its module imports pyspark only when run.
job.add_command(run_backfill)
# Last, once every command is registered.
accept_global_options_after_subcommands(cli)


def main() -> None:
    """Console-script entry point (`metastore`)."""
    cli(prog_name="metastore")


if __name__ == "__main__":
    main()
