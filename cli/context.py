"""The global options of `metastore` and the client built from them.

Defaults are those of a developer working in the repository: the endpoints of the local
cluster (`cluster_configs/local/cluster.toml`, read relative to the working directory) and its
admin token (`cluster_configs/local/secrets/admin.token`). Every default is overridden by a
flag or a `METASTORE_*` environment variable, in that order of precedence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import click

from cli.errors import EXIT_USAGE, CliError
from hlc import SystemClock, parse_ts
from hlc.errors import TimestampParseError
from metastore.client import ENDPOINTS_MAX, SyncMetastoreClient, parse_endpoint
from metastore.daemon.config import CLUSTER_FILE_NAME, load_cluster_config
from metastore.daemon.secrets import Role, read_token_file, token_file_name

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
    _client: SyncMetastoreClient | None = field(default=None, repr=False)

    def endpoints(self) -> list[str]:
        if self.endpoints_option:
            endpoints = [e.strip() for e in self.endpoints_option.split(",") if e.strip()]
            if not endpoints:
                raise _usage("--endpoints is empty")
            if len(endpoints) > ENDPOINTS_MAX:
                raise _usage(f"at most {ENDPOINTS_MAX} endpoints")
            for endpoint in endpoints:
                parse_endpoint(endpoint)
            return list(dict.fromkeys(endpoints))
        if LOCAL_CLUSTER_FILE.exists():
            return load_cluster_config(LOCAL_CLUSTER_FILE).client_endpoints()
        raise CliError(
            "NO_ENDPOINTS",
            f"no endpoints: pass --endpoints host:port,... (or METASTORE_ENDPOINTS), or run "
            f"from a directory containing {LOCAL_CLUSTER_FILE}",
            exit_code=EXIT_USAGE,
        )

    def resolve_token(self) -> str | None:
        """--token, else the token file (--token-file, else the local admin token if present)."""
        if self.token:
            return self.token
        if self.token_file is not None:
            return read_token_file(self.token_file)
        if LOCAL_ADMIN_TOKEN_FILE.exists():
            return read_token_file(LOCAL_ADMIN_TOKEN_FILE)
        return None

    def client(self) -> SyncMetastoreClient:
        if self._client is None:
            self._client = SyncMetastoreClient(
                self.endpoints(),
                self.resolve_token(),
                timeout_ms=self.timeout_ms,
                client_name=CLI_CLIENT_NAME,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def app(ctx: click.Context) -> App:
    obj = ctx.find_object(App)
    if obj is None:  # only when a sub-command is invoked without the root group
        raise CliError("INTERNAL", "the metastore command group was not set up")
    return obj


class TimestampParam(click.ParamType[int]):
    """An HLC timestamp as `hlc.parse_ts` reads it: HLC integer, ISO-8601, `-5m`, `now`."""

    name = "TS"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_ts(str(value), now_ms=SystemClock().now_ms())
        except TimestampParseError as exc:
            self.fail(str(exc), param, ctx)


TIMESTAMP: Final = TimestampParam()


def _usage(message: str) -> CliError:
    return CliError("USAGE", message, exit_code=EXIT_USAGE)
