"""What applying one entry produced: the reply and the effects, as plain data.

`apply` never raises for an expected failure and never performs I/O. It returns an `Outcome`:
either `ok` with a `result` (a msgpack-able dict such as `{"version": 3, "tu": ...}`) or not ok
with `error` (the wire dict of a `MetastoreError`). `effects` tell the shell what to act on; the
state machine itself does nothing with them. In particular, IEP-98 says a DDL call may only return
to its client once `now >= Tu + CSmax`: the shell reads `tu` from `SchemaVersionPublished` /
`TableDropped` and waits before replying.

Invariant: `ok` <=> `error is None`; an outcome with an error has no effects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metastore.commands import TableName, table_name_from_data
from metastore.errors import MalformedSnapshotError, MetastoreError


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaVersionPublished:
    """A new schema version of `table` (version 1 = the table was created) activates at `tu`."""

    table: TableName
    table_id: int
    version: int
    tu: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TableDropped:
    """`table` stops existing for reads at timestamps >= `tu`."""

    table: TableName
    table_id: int
    tu: int


Effect = SchemaVersionPublished | TableDropped


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    ok: bool
    result: dict[str, object] = field(default_factory=dict)
    error: dict[str, object] | None = None
    effects: tuple[Effect, ...] = ()
    # True when this is the recorded outcome of an earlier entry with the same request id, or
    # the recorded result of a CommitTxn whose txn id already committed (same writes).
    deduplicated: bool = False

    @staticmethod
    def success(result: dict[str, object], effects: tuple[Effect, ...] = ()) -> Outcome:
        return Outcome(ok=True, result=result, effects=effects)

    @staticmethod
    def failure(error: MetastoreError) -> Outcome:
        return Outcome(ok=False, error=error.to_wire())

    def exception(self) -> MetastoreError | None:
        """The typed error of a failed outcome (None when ok)."""
        return None if self.error is None else MetastoreError.from_wire(self.error)

    def raise_for_error(self) -> None:
        exc = self.exception()
        if exc is not None:
            raise exc

    def to_data(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "result": self.result,
            "error": self.error,
            "effects": [_effect_to_data(e) for e in self.effects],
            "deduplicated": self.deduplicated,
        }

    @staticmethod
    def from_data(data: object) -> Outcome:
        """Inverse of `to_data`; MalformedSnapshotError on a bad shape."""
        if not isinstance(data, dict) or set(data) != {
            "ok",
            "result",
            "error",
            "effects",
            "deduplicated",
        }:
            raise MalformedSnapshotError("outcome must be a map with the five outcome keys")
        ok, result, error = data["ok"], data["result"], data["error"]
        effects, deduplicated = data["effects"], data["deduplicated"]
        if not isinstance(ok, bool) or not isinstance(deduplicated, bool):
            raise MalformedSnapshotError("outcome ok/deduplicated must be booleans")
        if not isinstance(result, dict) or not all(isinstance(k, str) for k in result):
            raise MalformedSnapshotError("outcome result must be a map with string keys")
        if error is not None and (
            not isinstance(error, dict) or not all(isinstance(k, str) for k in error)
        ):
            raise MalformedSnapshotError("outcome error must be nil or a map")
        if ok != (error is None) or not isinstance(effects, list):
            raise MalformedSnapshotError("outcome is inconsistent")
        return Outcome(
            ok=ok,
            result=result,
            error=error,
            effects=tuple(_effect_from_data(e) for e in effects),
            deduplicated=deduplicated,
        )


def _effect_to_data(effect: Effect) -> list[object]:
    match effect:
        case SchemaVersionPublished():
            table = [effect.table.namespace, effect.table.name]
            return ["published", table, effect.table_id, effect.version, effect.tu]
        case TableDropped():
            return [
                "dropped",
                [effect.table.namespace, effect.table.name],
                effect.table_id,
                effect.tu,
            ]


def _effect_from_data(data: object) -> Effect:
    if not isinstance(data, list) or len(data) < 2 or not isinstance(data[1], list):
        raise MalformedSnapshotError("effect must be [tag, [namespace, name], numbers...]")
    numbers = [i for i in data[2:] if isinstance(i, int) and not isinstance(i, bool)]
    if len(numbers) != len(data) - 2:
        raise MalformedSnapshotError("effect numbers must be integers")
    table_data: list[object] = data[1]
    try:
        table = table_name_from_data(table_data)
    except MetastoreError as e:
        raise MalformedSnapshotError(f"effect table: {e.message}") from None
    if data[0] == "published" and len(numbers) == 3:
        return SchemaVersionPublished(
            table=table, table_id=numbers[0], version=numbers[1], tu=numbers[2]
        )
    if data[0] == "dropped" and len(numbers) == 2:
        return TableDropped(table=table, table_id=numbers[0], tu=numbers[1])
    raise MalformedSnapshotError(f"unknown effect {data[0]!r}")
