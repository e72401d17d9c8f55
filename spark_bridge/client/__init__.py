"""Deprecated: the protocol client moved to `metastore.client` (issue 11 item 6).

`from metastore.client import SyncMetastoreClient` keeps working for existing user code and
for branches written before the move: every name, public or not, is looked up in
`metastore.client.protocol`, so a name added there is found here too. New code imports
`metastore.client`.

Why a package (`spark_bridge/client/__init__.py`) and not a module at the old path
`spark_bridge/client.py`: a file left at the old path makes git treat the move as an edit of
that file, so a concurrent branch's edits to the client merge into this shim (a conflict)
instead of following the code to `metastore/client/protocol.py`. A different path keeps the
move a rename.
"""

from __future__ import annotations

from typing import Any

from metastore.client import protocol as _protocol
from metastore.client.protocol import *  # noqa: F403  (re-export for old imports)
from metastore.client.protocol import __all__ as __all__


def __getattr__(name: str) -> Any:
    """Names outside `__all__` (limits, helpers) resolve in the new module too."""
    try:
        return getattr(_protocol, name)
    except AttributeError:
        raise AttributeError(f"module 'spark_bridge.client' has no attribute {name!r}") from None
