"""`history` of a wide table with many versions: every version carries its whole schema, so
a table of 900 commented columns outgrows the 4 MiB client frame after some 25 schema
changes. Before, the reply could not be encoded and every `history` of that table (the
client's, `metastore table history`) failed with INTERNAL. Now `history` is keyset-paged by
version like the other lists that grow (a caller that asks for no page gets LIMIT_EXCEEDED
when it does not fit one reply), and the client follows the pages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import BadRequestError, LimitExceededError
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

COLUMNS = 900
ALTERS = 30
TABLE = "h.wide"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncMetastoreClient]:
    with metastore_cluster(
        tmp_path_factory.mktemp("history"), 1, dd_ms=60, cs_max_ms=20, idle_safe_time_interval_ms=50
    ) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        with SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=60_000) as client:
            client.ddl("CREATE NAMESPACE h")
            comment = "x" * 40
            columns = ", ".join(f"c{i:04d} STRING COMMENT '{comment}'" for i in range(COLUMNS))
            client.ddl(f"CREATE TABLE {TABLE} ({columns})")
            for n in range(ALTERS):
                client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN a{n:02d} INT")
            yield client


def test_the_client_reads_every_version_through_pages(client: SyncMetastoreClient) -> None:
    versions = client.history(TABLE)["versions"]
    assert [v["version"] for v in versions] == list(range(1, ALTERS + 2))
    assert len(versions[-1]["schema"]["columns"]) == COLUMNS + ALTERS


def test_history_pages_are_disjoint_and_a_caller_that_does_not_page_is_refused(
    client: SyncMetastoreClient,
) -> None:
    with pytest.raises(LimitExceededError):
        client.call("history", {"table": TABLE})
    first = client.call("history", {"table": TABLE, "limit": 4})
    assert [v["version"] for v in first["versions"]] == [1, 2, 3, 4]
    second = client.call(
        "history", {"table": TABLE, "limit": 4, "page_token": first["next_page_token"]}
    )
    assert [v["version"] for v in second["versions"]] == [5, 6, 7, 8]
    with pytest.raises(BadRequestError):
        client.call("history", {"table": TABLE, "limit": 4, "page_token": "garbage"})
