"""The bridge has Spark look at the files it names on the driver, up to
DRIVER_LISTING_PATHS_MAX of them, instead of a Spark job with a task per file (Spark's default
past 32 paths: 40 s to plan a read of 10,000 local files, 1.6 s on the driver); a session that
set the threshold itself keeps its value. No Spark here: the session's conf is a dict."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from spark_bridge.bridge import DRIVER_LISTING_PATHS_MAX, _list_explicit_files_on_the_driver

KEY = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def _spark(conf: dict[str, str]) -> Any:
    return SimpleNamespace(
        conf=SimpleNamespace(
            get=lambda key, default=None: conf.get(key, default),
            set=lambda key, value: conf.__setitem__(key, value),
        )
    )


def test_an_untouched_session_lists_the_bridges_files_on_the_driver() -> None:
    conf: dict[str, str] = {}
    _list_explicit_files_on_the_driver(_spark(conf))
    assert conf == {KEY: str(DRIVER_LISTING_PATHS_MAX)}


def test_a_threshold_the_session_set_is_kept() -> None:
    conf = {KEY: "500"}
    _list_explicit_files_on_the_driver(_spark(conf))
    assert conf == {KEY: "500"}
