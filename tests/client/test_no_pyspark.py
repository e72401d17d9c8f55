"""The client's import path never loads PySpark: the CLI and operators' scripts use the client
without a JVM, and `import pyspark` alone costs about a second. Checked in a fresh interpreter,
because the test process itself may have imported pyspark already."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import {module}
loaded = sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark."))
print("pyspark modules:", loaded)
assert "pyspark" not in sys.modules, loaded
"""


@pytest.mark.parametrize(
    "module",
    [
        "metastore.client",
        "metastore.client.protocol",
        # The Parquet reader the CLI's `table read` and the data source share.
        "metastore.client.parquet",
        "cli.table_data",
        # The deprecated re-export keeps the promise too.
        "spark_bridge.client",
        # The CLI's entry point, which stands on the client.
        "cli.main",
    ],
)
def test_import_does_not_load_pyspark(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_deprecated_path_is_the_same_client() -> None:
    import metastore.client
    import metastore.client.protocol
    import spark_bridge.client

    assert spark_bridge.client.SyncMetastoreClient is metastore.client.SyncMetastoreClient
    assert spark_bridge.client.MetastoreClient is metastore.client.MetastoreClient
    # Names outside __all__ (limits) resolve through the module's __getattr__.
    assert spark_bridge.client.FILES_PAGE_LIMIT == metastore.client.protocol.FILES_PAGE_LIMIT
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = spark_bridge.client.no_such_name
