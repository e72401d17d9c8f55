"""Values of rows read by `metastore table read` (metastore.client.parquet), as JSON and as table
cells."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from decimal import Decimal


def json_value(value: object) -> object:
    """A value of `Table.to_pylist()` as JSON: decimals as strings (no precision lost), times as
    ISO-8601, binary as base64, maps as objects when every key is a string, NaN/infinities as
    strings (JSON has no literal for them)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(p, tuple) and len(p) == 2 for p in value):
            # pyarrow gives a MAP as a list of (key, value) pairs.
            if all(isinstance(k, str) for k, _ in value):
                return {k: json_value(v) for k, v in value}
            return [{"key": json_value(k), "value": json_value(v)} for k, v in value]
        return [json_value(v) for v in value]
    return str(value)


def text_value(value: object) -> str:
    """A value as one table cell: NULL for null (as Spark's show prints it), JSON for nested."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    shown = json_value(value)
    if isinstance(shown, str):
        return shown
    return json.dumps(shown, sort_keys=True, ensure_ascii=False)
