"""A MetastoreBridge without Spark, for tests of its pure paths (planning, listing, commit)
against a real daemon or a stand-in session: `object.__new__` skips the constructor, which
needs a SparkSession, and only the attributes those paths read are set."""

from __future__ import annotations

import threading
from typing import Any

from spark_bridge.bridge import MetastoreBridge


def bare_bridge(
    client: Any, *, session: Any = None, loose_files_max: int | None = 0
) -> MetastoreBridge:
    """`loose_files_max=0` (default): no automatic compaction; None: the cluster's bound."""
    bridge = object.__new__(MetastoreBridge)
    bridge.client = client
    bridge.spark = None  # type: ignore[assignment]
    bridge.session = session
    bridge.unleased_session = None
    bridge.loose_files_max = loose_files_max
    bridge._cluster_loose_max = None
    bridge._loose_estimate = {}
    bridge._commit_lock = threading.Lock()
    bridge._last_commit_ts = 0
    bridge.compactions = 0
    bridge._protections = []
    bridge._protections_lock = threading.Lock()
    return bridge
