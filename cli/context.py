"""The global options of `metastore` and the client built from them.

Defaults are those of a developer working in the repository: the endpoints of the local
cluster (`cluster_configs/local/cluster.toml`, read relative to the working directory) and its
admin token (`cluster_configs/local/secrets/admin.token`). Every default is overridden by a
flag or a `METASTORE_*` environment variable, in that order of precedence.

TLS (like etcdctl): `--cacert` (trust this CA), `--cert`/`--key` (a client certificate, for
ports that require one), `--tls-server-name`; any of them turns TLS on, and so does `--tls`
alone (the system's trust store). Without any, a command that reads a cluster.toml (the
local default, `cluster up`) uses TLS as that file's `[tls]` says, trusting its `ca_file`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import click

from cli.errors import EXIT_USAGE, CliError
from hlc import SystemClock, make_ts, parse_ts, physical_ms, span_text, to_iso
from hlc.errors import TimestampParseError
from hlc.limits import LOGICAL_BITS
from metastore.client import (
    ENDPOINTS_MAX,
    SyncMetastoreClient,
    parse_endpoint,
    refuse_protection_ahead,
)
from metastore.commands import TableName, normalize_object_name, parse_duration_ms
from metastore.daemon.api_limits import PROTECT_AHEAD_MS_MAX
from metastore.daemon.config import CLUSTER_FILE_NAME, ClusterConfig, load_cluster_config
from metastore.daemon.secrets import Role, SecretsError, read_token_file, token_file_name
from metastore.errors import ErrorCode, InvalidArgumentError, MetastoreError
from metastore.limits import MAX_CLOCK_SKEW_MS
from raft.tls import ClientTls

LOCAL_CONFIG_DIR: Final = Path("cluster_configs") / "local"
LOCAL_CLUSTER_FILE: Final = LOCAL_CONFIG_DIR / CLUSTER_FILE_NAME
LOCAL_ADMIN_TOKEN_FILE: Final = LOCAL_CONFIG_DIR / "secrets" / token_file_name(Role.ADMIN)
CLI_CLIENT_NAME: Final = "metastore-cli"


@dataclass(slots=True, kw_only=True)
class App:
    """Parsed global options; builds the client on first use and closes it at exit."""

    endpoints_option: str | None
    token: str | None
    token_file: Path | None
    output: str
    timeout_ms: int
    tls: bool = False
    cacert: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    tls_server_name: str | None = None
    # --endpoints given as a flag (not METASTORE_ENDPOINTS): it and --config cannot both say.
    endpoints_explicit: bool = False
    # --token / --token-file given as flags (not METASTORE_TOKEN / METASTORE_TOKEN_FILE): only
    # those beat the admin token of a cluster named by its config directory.
    token_explicit: bool = False
    token_file_explicit: bool = False
    # A read command's --config DIR: a cluster directory in place of the local default.
    config_dir: Path | None = None
    # The command takes --config DIR (errors about missing endpoints then name it).
    config_option_offered: bool = False
    _client: SyncMetastoreClient | None = field(default=None, repr=False)

    def client_tls(self, config: ClusterConfig | None = None) -> ClientTls | None:
        """The TLS options: the flags if any is given, else the `[tls]` of `config` (when its
        client ports speak TLS), else None (plaintext)."""
        if (self.cert is None) != (self.key is None):
            raise _usage("--cert and --key go together")
        flags = (self.cacert, self.cert, self.key, self.tls_server_name)
        if self.tls or any(f is not None for f in flags):
            return ClientTls(
                ca_file=self.cacert,
                cert_file=self.cert,
                key_file=self.key,
                server_name=self.tls_server_name,
            )
        if config is not None and config.tls is not None and config.tls.clients:
            return ClientTls(ca_file=config.tls.ca_file)
        return None

    def _endpoints_from_option(self) -> bool:
        """--endpoints (or METASTORE_ENDPOINTS) rather than a cluster.toml. A --config DIR
        given to the command beats the environment variable; with the --endpoints flag it is
        a contradiction."""
        if self.config_dir is not None:
            if self.endpoints_explicit and self.endpoints_option:
                raise _usage("--endpoints and --config both name the nodes: pass one")
            return False
        return bool(self.endpoints_option)

    def endpoints(self) -> list[str]:
        if self._endpoints_from_option():
            assert self.endpoints_option is not None
            endpoints = [e.strip() for e in self.endpoints_option.split(",") if e.strip()]
            if not endpoints:
                raise _usage("--endpoints is empty")
            if len(endpoints) > ENDPOINTS_MAX:
                raise _usage(f"at most {ENDPOINTS_MAX} endpoints")
            for endpoint in endpoints:
                try:
                    parse_endpoint(endpoint)
                except InvalidArgumentError as exc:  # a bad flag: usage (2), not a refusal (5)
                    raise _usage(f"--endpoints: {exc.message}") from None
            return list(dict.fromkeys(endpoints))
        if (local := self._local_config()) is not None:
            return local.client_endpoints()
        config = (
            " or --config DIR (a `metastore cluster init` directory),"
            if self.config_option_offered
            else ""
        )
        raise CliError(
            "NO_ENDPOINTS",
            f"no endpoints: pass --endpoints host:port,... (or METASTORE_ENDPOINTS),{config} or "
            f"run from a directory containing {LOCAL_CLUSTER_FILE}",
            exit_code=EXIT_USAGE,
        )

    def endpoints_source(self) -> str:
        """Where `endpoints()` takes the addresses from, for messages."""
        if self._endpoints_from_option():
            return "--endpoints / METASTORE_ENDPOINTS"
        return str(self._cluster_file())

    def talking_through_config(self) -> ClusterConfig | None:
        """The cluster.toml this CLI takes its endpoints from (--config DIR, else the local
        default's), or None when they come from --endpoints / METASTORE_ENDPOINTS."""
        if self._endpoints_from_option():
            return None
        return self._local_config()

    def _cluster_file(self) -> Path:
        return (
            LOCAL_CLUSTER_FILE if self.config_dir is None else self.config_dir / CLUSTER_FILE_NAME
        )

    def _local_config(self) -> ClusterConfig | None:
        """The cluster.toml of --config DIR (which must exist), else the local default's (if
        there is one)."""
        if self.config_dir is not None:
            return load_cluster_config(self._cluster_file())
        return load_cluster_config(LOCAL_CLUSTER_FILE) if LOCAL_CLUSTER_FILE.exists() else None

    def _default_token_file(self) -> Path:
        """The admin token of --config DIR's cluster (its secrets_dir), else the local one."""
        if self.config_dir is not None and (config := self._local_config()) is not None:
            return config.secrets_dir / token_file_name(Role.ADMIN)
        return LOCAL_ADMIN_TOKEN_FILE

    def _token_options(self, cluster_token_file: Path | None) -> tuple[str | None, Path | None]:
        """--token and --token-file as they apply to a command about one cluster whose admin
        token is `cluster_token_file` (its config directory's secrets; None: no such cluster).
        When that file exists, only the flags given on this command line beat it: like
        METASTORE_ENDPOINTS, METASTORE_TOKEN(_FILE) were exported for some cluster, often
        another one (the README's restore seeds a second cluster from the same shell)."""
        if cluster_token_file is not None and cluster_token_file.exists():
            return (
                self.token if self.token_explicit else None,
                self.token_file if self.token_file_explicit else None,
            )
        return self.token, self.token_file

    def _command_cluster_token_file(self) -> Path | None:
        return self._default_token_file() if self.config_dir is not None else None

    def resolve_token(self) -> str | None:
        """--token, else the token file (--token-file, else the local admin token if present).
        With --config DIR: DIR's admin token unless a flag gives one (`_token_options`)."""
        return self._resolve_token(self._command_cluster_token_file())

    def token_for_cluster(self, config: ClusterConfig) -> str | None:
        """The token for a command that manages the cluster of `config` (`cluster up`): a
        --token or --token-file flag, else its admin token, else the environment's."""
        return self._resolve_token(config.secrets_dir / token_file_name(Role.ADMIN))

    def _resolve_token(self, cluster_token_file: Path | None) -> str | None:
        token, token_file = self._token_options(cluster_token_file)
        if token:
            return token
        if token_file is not None:
            try:
                return read_token_file(token_file)
            except SecretsError as exc:
                # Say which setting named the file: often an export from another session.
                raise CliError(
                    exc.code,
                    f"{exc} (the token file named by --token-file / METASTORE_TOKEN_FILE)",
                    exit_code=EXIT_USAGE,
                ) from None
        default = cluster_token_file or self._default_token_file()
        if default.exists():
            return read_token_file(default)
        return None

    def token_source(self) -> str | None:
        """Where the token `resolve_token` returns comes from, for messages (None: no token)."""
        token, token_file = self._token_options(self._command_cluster_token_file())
        if token:
            return "--token / METASTORE_TOKEN"
        if token_file is not None:
            return str(token_file)
        if (default := self._default_token_file()).exists():
            return f"{default} (the default)" if self.config_dir is None else str(default)
        return None

    def client(self) -> SyncMetastoreClient:
        if self._client is None:
            self._client = SyncMetastoreClient(
                self.endpoints(),
                self.resolve_token(),
                timeout_ms=self.timeout_ms,
                client_name=CLI_CLIENT_NAME,
                tls=self.client_tls(
                    None if self._endpoints_from_option() else self._local_config()
                ),
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _set_config_dir(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if ctx.resilient_parsing:
        return
    app(ctx).config_option_offered = True  # called for every parse, given or not
    if value is not None:
        app(ctx).config_dir = value


# `--config DIR` for commands that only talk to a cluster (status, safe-time...): right after
# `metastore cluster up --config DIR`, without exporting its endpoints and token.
config_dir_option = click.option(
    "--config",
    "config_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    default=None,
    expose_value=False,
    callback=_set_config_dir,
    help="Talk to the cluster configured in DIR (`metastore cluster init DIR`): its client "
    "endpoints and TLS settings from DIR/cluster.toml (beats METASTORE_ENDPOINTS; not with "
    "--endpoints), and its admin token from DIR's secrets unless the --token or --token-file "
    "flag gives one (it beats METASTORE_TOKEN and METASTORE_TOKEN_FILE, which may be "
    f"another cluster's). Default: {LOCAL_CONFIG_DIR} if it exists here.",
)


# The reason metastore.client gives for an endpoint that refused the connection.
CONNECTION_REFUSED: Final = "connection refused"


def nothing_listens(errors: list[MetastoreError]) -> bool:
    """Every endpoint refused the connection (a cluster not started, or another's ports)."""
    refused = [e.details.get("endpoints") for e in errors]
    return bool(errors) and all(
        e.code is ErrorCode.UNAVAILABLE
        and isinstance(by_endpoint, dict)
        and by_endpoint
        and all(reason == CONNECTION_REFUSED for reason in by_endpoint.values())
        for e, by_endpoint in zip(errors, refused, strict=True)
    )


def nothing_listens_hint(a: App) -> str:
    """What to check when `nothing_listens`: whether the cluster is up, and where the
    endpoints came from."""
    return (
        "nothing listens there: is the cluster up? `metastore cluster up --config DIR` starts "
        f"it; the endpoints are from {a.endpoints_source()}"
    )


def app(ctx: click.Context) -> App:
    obj = ctx.find_object(App)
    if obj is None:  # only when a sub-command is invoked without the root group
        raise CliError("INTERNAL", "the metastore command group was not set up")
    return obj


_READ_AHEAD_MEANS: Final = "no node can answer for a time its clock has not reached"


class TimestampParam(click.ParamType[int]):
    """An HLC timestamp as `hlc.parse_ts` reads it: HLC integer, ISO-8601, `-5m`, `now`.

    With `max_ahead_ms`, a time further than that ahead of this machine's clock is a usage
    error: a read at a time no node's clock has reached cannot be answered (a node refuses a
    timestamp more than the cluster's CSmax ahead of its clock), and one beyond any CSmax a
    cluster may have (MAX_CLOCK_SKEW_MS) is a typo, not something to retry later. With
    `refuse_ahead`, that library rule decides instead (its InvalidArgumentError's message is the
    usage error's): the rule the API behind the option applies too."""

    name = "TS"

    def __init__(
        self,
        *,
        max_ahead_ms: int | None = None,
        refuse_ahead: Callable[..., None] | None = None,
    ) -> None:
        self.max_ahead_ms = max_ahead_ms
        # Called as refuse_ahead(ts, now_ms=...); raises InvalidArgumentError to refuse.
        self.refuse_ahead = refuse_ahead

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        now_ms = SystemClock().now_ms()
        try:
            ts = parse_ts(str(value), now_ms=now_ms)
        except TimestampParseError as exc:
            self.fail(str(exc), param, ctx)
        # Only digits make an HLC integer (parse_ts); those are what an epoch time looks like.
        pasted_epoch = str(value).strip().isdigit()
        meant = epoch_time_meant(ts, now_ms=now_ms) if pasted_epoch else None
        if meant is not None and physical_ms(ts) < PLAUSIBLE_CLUSTER_TIME_FROM_MS:
            self.fail(_epoch_hint(value, ts, meant, param), param, ctx)
        ahead_ms = physical_ms(ts) - now_ms
        if self.max_ahead_ms is not None and ahead_ms > self.max_ahead_ms:
            if meant is not None:  # epoch nanoseconds read as an HLC land centuries ahead
                self.fail(_epoch_hint(value, ts, meant, param), param, ctx)
            if self.refuse_ahead is None:
                self.fail(
                    f"{value!r} is in the future by {span_text(ahead_ms)}: {_READ_AHEAD_MEANS} "
                    f"(a cluster tolerates at most {span_text(self.max_ahead_ms)} of clock skew)",
                    param,
                    ctx,
                )
        if self.refuse_ahead is not None:
            try:
                self.refuse_ahead(ts, now_ms=now_ms)
            except InvalidArgumentError as exc:
                self.fail(exc.message, param, ctx)
        return ts


# An HLC integer whose time is before this (2000-01-01) belongs to no cluster: this metastore
# did not exist, and a node's clock is not set decades back. Pasting epoch seconds,
# milliseconds or microseconds (what `date +%s%3N`, Kafka and Spark print) as --as-of gives
# such an integer: an HLC is epoch ms << LOGICAL_BITS, so epoch ms read as one is ~1970.
PLAUSIBLE_CLUSTER_TIME_FROM_MS: Final = 946_684_800_000
# Each unit an epoch integer is commonly written in, and how to turn it into milliseconds.
_EPOCH_UNITS: Final = (
    ("seconds", 1000, 1),
    ("milliseconds", 1, 1),
    ("microseconds", 1, 1000),
    ("nanoseconds", 1, 1_000_000),
)


@dataclass(frozen=True, slots=True)
class EpochTimeMeant:
    """The epoch time an integer most likely was: its unit and the millisecond it names."""

    unit: str
    epoch_ms: int


def epoch_time_meant(value: int, *, now_ms: int) -> EpochTimeMeant | None:
    """The unit in which `value`, read as an epoch time, lands between 2000 and a day past
    `now_ms`, if one does (at most one can: the units are 1000x apart); else None."""
    for unit, times, divided_by in _EPOCH_UNITS:
        epoch_ms = value * times // divided_by
        if PLAUSIBLE_CLUSTER_TIME_FROM_MS <= epoch_ms <= now_ms + 86_400_000:
            return EpochTimeMeant(unit=unit, epoch_ms=epoch_ms)
    return None


def _epoch_hint(
    value: object, ts: int, meant: EpochTimeMeant, param: click.Parameter | None
) -> str:
    """Refuse rather than reinterpret: the integer is a valid HLC, and a script that relies on
    one reading must not get the other silently."""
    flag = param.opts[0] if param is not None and param.opts else "--as-of"
    hlc_meant = make_ts(meant.epoch_ms)
    try:
        as_hlc = f"{to_iso(ts)}, decades before any cluster"
    except ValueError:  # past the year 9999: no date form
        as_hlc = "centuries ahead"
    return (
        f"{value!r} read as an HLC timestamp is {as_hlc}; it looks like epoch {meant.unit}. "
        f"For that time pass {flag} {to_iso(hlc_meant)} or its HLC integer {flag} {hlc_meant} "
        f"(an HLC is epoch milliseconds << {LOGICAL_BITS})"
    )


# Reads (--as-of, watch --from): at most the largest clock skew a cluster may be set up with.
READ_TIMESTAMP: Final = TimestampParam(max_ahead_ms=MAX_CLOCK_SKEW_MS)
# `pts protect --ts`: the client library's rule (a protection of reads at or after a time still
# to come holds nothing the GC could delete now: a year typed wrong), which the Spark bridge's
# protect() applies too; refused here as a usage error, before any request.
PROTECT_TIMESTAMP: Final = TimestampParam(
    max_ahead_ms=PROTECT_AHEAD_MS_MAX, refuse_ahead=refuse_protection_ahead
)


class TableNameParam(click.ParamType[str]):
    """A table name `NS.TABLE` (or, with `namespace_allowed`, a namespace `NS` too), checked
    while click parses, as the nodes check it (metastore.commands.TableName): a name the server
    would refuse as INVALID_ARGUMENT (exit 5, after a round trip) is a usage error (exit 2) that
    names the argument, before any request. The value is passed on as typed (the nodes fold
    case). Its metavar is what --help shows, the same in every command."""

    def __init__(self, *, namespace_allowed: bool = False) -> None:
        self.namespace_allowed = namespace_allowed
        self.name = "NS[.TABLE]" if namespace_allowed else "NS.TABLE"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        try:
            if self.namespace_allowed and "." not in text:
                normalize_object_name(text, "namespace")
            else:
                TableName.parse(text)
        except MetastoreError as exc:
            self.fail(f"{text!r}: {_without_repeat(exc.message, text)}", param, ctx)
        return text


def _without_repeat(message: str, text: str) -> str:
    # TableName.parse says "table name 'x' must have the form namespace.table": the value is
    # already at the start of the line.
    return message.replace(f" {text!r}", "")


TABLE_NAME: Final = TableNameParam()
TABLE_OR_NAMESPACE: Final = TableNameParam(namespace_allowed=True)


class DurationParam(click.ParamType[int]):
    """A duration as `metastore.commands.parse_duration_ms` reads it (500ms, 90s, 5m, 6h, 7d; a
    bare number is seconds) -> milliseconds, checked against [min_ms, max_ms] while click parses,
    so a bad value is a usage error that names its flag, in the units it was given in."""

    name = "DURATION"

    def __init__(self, *, min_ms: int = 0, max_ms: int | None = None) -> None:
        self.min_ms = min_ms
        self.max_ms = max_ms

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # a default already in ms
        text = str(value)
        try:
            ms = parse_duration_ms(text, "duration")
        except InvalidArgumentError:
            self.fail(
                f"{text!r} is not a duration (e.g. 30s, 5m, 1h, 7d, 500ms; a bare number is "
                "seconds)",
                param,
                ctx,
            )
        if ms < self.min_ms:
            self.fail(f"{text!r} is shorter than {duration_text(self.min_ms)}", param, ctx)
        if self.max_ms is not None and ms > self.max_ms:
            self.fail(f"{text!r} is longer than {duration_text(self.max_ms)}", param, ctx)
        return ms


def duration_text(ms: int) -> str:
    """Milliseconds in the largest unit `DurationParam` reads that divides them (3650d, 90s)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _usage(message: str) -> CliError:
    return CliError("USAGE", message, exit_code=EXIT_USAGE)
