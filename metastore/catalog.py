"""The catalog component of the state: namespaces, tables and their schema versions over time.

Key idea (IEP-98): a change applied at Tm does not take effect at Tm but at Tu = Tm + DD. Every
replica applies the same entries in the same order, so every replica computes the same Tu, and a
reader that has waited for safeTime >= Top - DD gets the same answer to "schema of T at Top" on any
node without asking any other node.

Jargon:
* *incarnation* (`TableState`) - one life of a table name between CREATE and DROP. Dropping and
  re-creating `ns.t` makes a new incarnation with a new `table_id`; the old one's history stays
  readable at old timestamps. A namespace (`Namespace`) has incarnations too: one life of the name
  between CREATE NAMESPACE and DROP NAMESPACE.
* *schema version* (`SchemaVersion`) - the table definition (columns, comment, properties) in
  force from its `tu` until the next version's `tu`. Version 1 is the CREATE.
* *live* - not dropped (its DROP may not yet have activated). Apply-time rules (CREATE TABLE needs
  its namespace, CREATE of an existing name fails) look at what is live; reads AS OF look at what
  exists at the timestamp.
* *location* - the table's data directory (absolute path or URI, "" = none), fixed for the
  incarnation's life and copied into every `SchemaVersion`, so a reader that pinned a version
  knows where its files live. No two live tables have overlapping locations (one equal to or
  below the other): GC will delete unreferenced files under a location, which must not be
  another table's data.

Time rules:
* a table or namespace created at tm exists for reads at Top >= tm + DD (`created_tu`); one dropped
  at tm stops existing at Top >= tm + DD (`dropped_tu`);
* `schema_at(t, Top)` is the version with the greatest tu <= Top in the incarnation alive at Top;
  `describe_at` describes that incarnation as of Top (format, location, the version in force, the
  number of versions with tu <= Top); `list_tables(ns, top=)` / `list_namespaces(top=)` list what
  exists at Top.
* Every answer for Top depends only on entries with Tm <= Top - DD, which a reader has applied once
  its safe time >= Top - DD: so it is the same on every node and never changes. That is why
  "nothing at Top" is TABLE_NOT_FOUND / NAMESPACE_NOT_FOUND whether or not a later incarnation
  exists (a node that applied the later CREATE and one that did not must agree), and
  NOT_FOUND_AT_TIMESTAMP only when the incarnation before Top was dropped at <= Top.

Invariants (checked by `check_invariants`):
* per incarnation: versions numbered 1, 2, 3...; tm strictly increasing; tu = tm + DD, so tu is
  strictly increasing too; `tus` mirrors the versions' tu (it is the bisect index);
* a drop is later than every version of its incarnation; incarnations of one name do not overlap
  in [created_tu, dropped_tu), and only the last can be live;
* field ids are unique within a schema and below the incarnation's `next_field_id`, and an id that
  left the schema (its column was dropped) never comes back;
* table ids are unique and below `next_table_id`; every live table's namespace is live;
* per namespace name: created_tu = created_tm + DD, dropped_tu = dropped_tm + DD, a drop after its
  create, incarnations in order without overlap, only the last can be live; every table
  incarnation lies inside one incarnation of its namespace ([created_tu, dropped_tu) within the
  namespace's), so a table never exists at a timestamp where its namespace does not;
* limits hold (tables, live namespaces, versions per table, columns, properties).

Mutations follow one discipline: compute every new value first (any error raises before the first
write), then write. So a failed command leaves the catalog exactly as it was.

Snapshot form (`to_data`): `namespace_form` 2 stores every namespace incarnation. Form-1 data
(older snapshots: live namespaces only, no activation time) still loads; see
`_namespaces_from_form1` for what it can and cannot rebuild. Dropped incarnations, of tables and
namespaces alike, are kept forever for reads at old timestamps (GC will bound them).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Final

import msgpack

from hlc import ts_text
from metastore import limits
from metastore.commands import (
    GC_TTL_PROPERTY,
    AddColumn,
    AlterColumnType,
    AlterTable,
    CreateNamespace,
    CreateTable,
    DropColumn,
    DropNamespace,
    DropTable,
    MoveColumn,
    Properties,
    RenameColumn,
    SetColumnComment,
    SetNullability,
    SetTableProperties,
    TableChange,
    TableName,
    UnsetTableProperties,
    column_from_data,
    column_to_data,
    location_contains,
    properties_from_data,
    validate_location,
    validate_properties,
)
from metastore.errors import (
    CatalogInvariantError,
    ColumnNotFoundError,
    InvalidArgumentError,
    MalformedSnapshotError,
    MetastoreError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    NotFoundAtTimestampError,
    SchemaJobConflictError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnsupportedSchemaChangeError,
    limit_exceeded,
)
from metastore.java_case import java_case_key
from metastore.outcome import Effect, SchemaVersionPublished, TableDropped
from metastore.schema import (
    Column,
    NameMatch,
    Schema,
    add_column,
    alter_column_type,
    assign_schema_ids,
    drop_column,
    move_column,
    new_name_key,
    path_sql,
    rename_column,
    set_column_comment,
    set_nullability,
    unique_names_key,
    validate_schema,
)
from metastore.types import NameKey, StructField, StructType, exact_name

# The catalog's own snapshot form of namespaces (`to_data`): 2 keeps every incarnation.
NAMESPACE_FORM: Final = 2

Result = dict[str, object]
# What a mutation returns: the reply and the effects for the shell.
Applied = tuple[Result, tuple[Effect, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    """One incarnation of a namespace name. Comment and properties never change in its life."""

    name: str
    comment: str | None
    properties: Properties
    created_tm: int
    created_tu: int  # Invariant: created_tm + DD; exists for reads at T >= created_tu
    dropped_tm: int | None = None
    dropped_tu: int | None = None  # Invariant: dropped_tm + DD; gone for reads at T >= it

    @property
    def live(self) -> bool:
        return self.dropped_tm is None


# States of a column that a multi-step schema change job (metastore.jobs) is adding or dropping.
# delete-only: hidden from readers and writers; write-only: hidden from readers, filled by writers.
DELETE_ONLY: Final = "delete_only"
WRITE_ONLY: Final = "write_only"
PENDING_STATES: Final = (DELETE_ONLY, WRITE_ONLY)
ADDING: Final = "add"
DROPPING: Final = "drop"
PENDING_ACTIONS: Final = (ADDING, DROPPING)


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingColumn:
    """A top-level column that is not public: being added or dropped by job `job_id`."""

    column: Column
    state: str  # one of PENDING_STATES
    job_id: int
    action: str  # one of PENDING_ACTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaVersion:
    """The definition of one table incarnation in force from `tu` (inclusive).

    `schema` holds the public columns: what readers see. `pending` holds the columns a schema
    change job is adding or dropping; writers also fill the write-only ones (`write_schema`)."""

    table_id: int
    version: int
    schema: Schema
    comment: str | None
    properties: Properties
    tm: int  # Tm of the entry that made this version
    tu: int  # activation: tm + DD
    summary: str  # canonical SQL of the change(s), e.g. "ADD COLUMN x INT"
    location: str = ""  # Invariant: the incarnation's location (not stored per version)
    pending: tuple[PendingColumn, ...] = ()  # Invariant: ordered by field id

    @property
    def write_schema(self) -> Schema:
        """What a writer pinned to this version writes: the public columns, then the write-only
        ones (filled with their DEFAULT, or NULL), so a reader of an older version that still
        shows them finds values in new files."""
        extra = tuple(p.column for p in self.pending if p.state == WRITE_ONLY)
        return Schema(columns=self.schema.columns + extra) if extra else self.schema


@dataclass(frozen=True, slots=True, kw_only=True)
class TableState:
    """One incarnation of a table name. Immutable: every change builds a new value."""

    table_id: int
    name: TableName
    format: str
    next_field_id: int  # Invariant: greater than every field id any version ever used
    versions: tuple[SchemaVersion, ...]  # Invariant: non-empty, version i+1 at index i
    tus: tuple[int, ...]  # Invariant: tuple(v.tu for v in versions), strictly increasing
    dropped_tm: int | None = None
    dropped_tu: int | None = None
    location: str = ""

    @property
    def created_tu(self) -> int:
        return self.tus[0]

    @property
    def live(self) -> bool:
        return self.dropped_tm is None


@dataclass(frozen=True, slots=True, kw_only=True)
class TableDescription:
    table: TableName
    table_id: int
    format: str
    current: SchemaVersion
    created_tu: int
    version_count: int
    location: str


class Catalog:
    """Namespaces and tables. Owned by `MetastoreState`, which passes the entry's Tm and DD."""

    __slots__ = ("_live", "_namespaces", "_next_table_id", "_tables")

    def __init__(self) -> None:
        # Every incarnation ever created under a namespace name, oldest first.
        self._namespaces: dict[str, tuple[Namespace, ...]] = {}
        # Every incarnation ever created under a name, oldest first.
        self._tables: dict[TableName, tuple[TableState, ...]] = {}
        # Derived index: namespace -> names of its live tables. Rebuilt from `_tables` on load.
        self._live: dict[str, set[TableName]] = {}
        self._next_table_id = 1

    # ----------------------------------------------------------------------------------------
    # Reads
    # ----------------------------------------------------------------------------------------

    def schema_at(self, table: TableName, top: int) -> SchemaVersion:
        """The version of `table` in force at `top` (the greatest tu <= top).

        Hot path: one dict lookup, a short scan of the incarnations and a bisect over the tus.
        """
        inc = self._incarnation_at(table, top)
        return inc.versions[bisect_right(inc.tus, top) - 1]

    def describe_at(self, table: TableName, top: int) -> TableDescription:
        """`table` as of `top`: the incarnation existing then (the one `schema_at` picks), the
        version in force and how many versions had activated. Raises like `schema_at`."""
        inc = self._incarnation_at(table, top)
        count = bisect_right(inc.tus, top)
        return TableDescription(
            table=table,
            table_id=inc.table_id,
            format=inc.format,
            current=inc.versions[count - 1],
            created_tu=inc.created_tu,
            version_count=count,
            location=inc.location,
        )

    def _incarnation_at(self, table: TableName, top: int) -> TableState:
        """The incarnation existing at `top`. Its answer depends only on entries with
        Tm <= top - DD (see the module docstring), so the errors carry nothing later."""
        for inc in reversed(self._tables.get(table, ())):
            if inc.tus[0] <= top:
                if inc.dropped_tu is not None and top >= inc.dropped_tu:
                    raise NotFoundAtTimestampError(
                        f"table {table} was dropped at {ts_text(inc.dropped_tu)}, before "
                        f"{ts_text(top)}",
                        details={"table": str(table), "top": top, "dropped_at_tu": inc.dropped_tu},
                    )
                return inc
        raise TableNotFoundError(
            f"table {table} does not exist at {ts_text(top)}",
            details={"table": str(table), "top": top},
        )

    def live_table(self, table: TableName) -> TableState:
        incarnations = self._tables.get(table)
        if incarnations is None or not incarnations[-1].live:
            raise _table_not_found(table)
        return incarnations[-1]

    def current(self, table: TableName) -> SchemaVersion:
        """The latest version of a live table (possibly not active yet)."""
        return self.live_table(table).versions[-1]

    def history(self, table: TableName) -> tuple[SchemaVersion, ...]:
        """Every version of the live incarnation, oldest first."""
        return self.live_table(table).versions

    def incarnations(self, table: TableName) -> tuple[TableState, ...]:
        """Every incarnation ever created under this name (dropped ones included), oldest first."""
        return self._tables.get(table, ())

    def all_incarnations(self) -> list[TableState]:
        """Every incarnation of every name, dropped ones included, in table id (creation)
        order. Not in `_tables`' order: a snapshot load rebuilds that dict in name order, so a
        node that installed a snapshot would meet the incarnations in another order than one
        that applied every entry, and name another table in a refusal (a Protect below two
        tables' thresholds)."""
        return sorted(
            (inc for incs in self._tables.values() for inc in incs), key=lambda i: i.table_id
        )

    def describe(self, table: TableName) -> TableDescription:
        """The live table now: its latest version (possibly not active yet)."""
        inc = self.live_table(table)
        return TableDescription(
            table=table,
            table_id=inc.table_id,
            format=inc.format,
            current=inc.versions[-1],
            created_tu=inc.created_tu,
            version_count=len(inc.versions),
            location=inc.location,
        )

    def namespace(self, name: str) -> Namespace:
        """The live incarnation of namespace `name`."""
        ns = self._live_namespace(name)
        if ns is None:
            raise _namespace_not_found(name)
        return ns

    def namespace_at(self, name: str, top: int) -> Namespace:
        """The incarnation of namespace `name` existing at `top`; errors as `schema_at`'s."""
        for ns in reversed(self._namespaces.get(name, ())):
            if ns.created_tu <= top:
                if ns.dropped_tu is not None and top >= ns.dropped_tu:
                    raise NotFoundAtTimestampError(
                        f"namespace {name} was dropped at {ts_text(ns.dropped_tu)}, before "
                        f"{ts_text(top)}",
                        details={"namespace": name, "top": top, "dropped_at_tu": ns.dropped_tu},
                    )
                return ns
        raise NamespaceNotFoundError(
            f"namespace {name} does not exist at {ts_text(top)}",
            details={"namespace": name, "top": top},
        )

    def namespace_incarnations(self, name: str) -> tuple[Namespace, ...]:
        """Every incarnation ever created under this namespace name, oldest first."""
        return self._namespaces.get(name, ())

    def _live_namespace(self, name: str) -> Namespace | None:
        incs = self._namespaces.get(name)
        return incs[-1] if incs and incs[-1].live else None

    def list_namespaces(self, *, top: int | None = None) -> tuple[Namespace, ...]:
        """Live namespaces by name; with `top`, the incarnations that exist for reads at `top`."""
        found = []
        for name in sorted(self._namespaces):
            incs = self._namespaces[name]
            if top is None:
                if incs[-1].live:
                    found.append(incs[-1])
            else:
                found.extend(ns for ns in incs if _ns_exists_at(ns, top))
        return tuple(found)

    def list_tables(self, namespace: str, *, top: int | None = None) -> tuple[TableName, ...]:
        """Live tables of the live `namespace`; with `top`, the tables that exist for reads at
        `top` in the namespace existing at `top` (NAMESPACE_NOT_FOUND / NOT_FOUND_AT_TIMESTAMP
        as `namespace_at`)."""
        if top is None:
            self.namespace(namespace)
            return tuple(sorted(self._live.get(namespace, ()), key=str))
        self.namespace_at(namespace, top)
        found = [
            name
            for name, incs in self._tables.items()
            if name.namespace == namespace and any(_exists_at(inc, top) for inc in incs)
        ]
        return tuple(sorted(found, key=str))

    def live_table_count(self) -> int:
        return sum(len(names) for names in self._live.values())

    def is_empty(self) -> bool:
        return not self._namespaces and not self._tables

    # ----------------------------------------------------------------------------------------
    # Mutations. Each validates fully, then writes; returns (result, effects).
    # ----------------------------------------------------------------------------------------

    def create_namespace(self, cmd: CreateNamespace, *, tm: int, dd: int) -> Applied:
        """A new incarnation of the name, existing for reads from tm + DD. A name whose drop is
        applied (even if not activated yet) may be created again: its new incarnation starts
        after the old one ends, because tm + DD > the drop's tm + DD."""
        name = cmd.namespace
        existing = self._live_namespace(name)
        if existing is not None:
            if cmd.if_not_exists:
                # Its tu lets the server's reply wait until the namespace is visible everywhere,
                # as for the caller who created it.
                return {"namespace": name, "created": False, "tu": existing.created_tu}, ()
            raise NamespaceAlreadyExistsError(
                f"namespace {name} already exists", details={"namespace": name}
            )
        # O(namespaces): CREATE NAMESPACE is rare.
        count = sum(1 for incs in self._namespaces.values() if incs[-1].live)
        if count >= limits.MAX_NAMESPACES:
            raise limit_exceeded("MAX_NAMESPACES", limits.MAX_NAMESPACES, count + 1, "namespaces")
        ns = Namespace(
            name=name,
            comment=cmd.comment,
            properties=cmd.properties,
            created_tm=tm,
            created_tu=tm + dd,
        )
        # --- write ---
        self._namespaces[name] = (*self._namespaces.get(name, ()), ns)
        return {"namespace": name, "created": True, "tu": ns.created_tu}, ()

    def drop_namespace(self, cmd: DropNamespace, *, tm: int, dd: int) -> Applied:
        """Drops the live incarnation (and with CASCADE its live tables) from tm + DD on."""
        ns = self._live_namespace(cmd.namespace)
        if ns is None:
            if cmd.if_exists:
                result: Result = {
                    "namespace": cmd.namespace,
                    "dropped": False,
                    "dropped_tables": [],
                }
                earlier = self._namespaces.get(cmd.namespace)
                if earlier:  # dropped already: the reply waits until that drop shows everywhere
                    result["tu"] = earlier[-1].dropped_tu
                return result, ()
            raise _namespace_not_found(cmd.namespace)
        live = sorted(self._live.get(cmd.namespace, ()), key=str)
        if live and not cmd.cascade:
            raise NamespaceNotEmptyError(
                f"namespace {cmd.namespace} has {_count(len(live), 'table')}; drop "
                f"{'it' if len(live) == 1 else 'them'} or use CASCADE",
                details={
                    "namespace": cmd.namespace,
                    "table_count": len(live),
                    "tables": [str(t) for t in live[:10]],
                },
            )
        dropped = [self._dropped(self.live_table(t), tm=tm, dd=dd) for t in live]
        dropped_ns = replace(ns, dropped_tm=tm, dropped_tu=tm + dd)
        # --- write ---
        for inc in dropped:
            self._tables[inc.name] = (*self._tables[inc.name][:-1], inc)
        self._live.pop(cmd.namespace, None)
        self._namespaces[cmd.namespace] = (*self._namespaces[cmd.namespace][:-1], dropped_ns)
        effects = tuple(
            TableDropped(table=inc.name, table_id=inc.table_id, tu=tm + dd) for inc in dropped
        )
        result = {
            "namespace": cmd.namespace,
            "dropped": True,
            "dropped_tables": [str(t) for t in live],
            "tu": tm + dd,
        }
        return result, effects

    def create_table(
        self,
        cmd: CreateTable,
        *,
        tm: int,
        dd: int,
        max_version_bytes: int | None = None,
        fold_file_uris: bool = False,
    ) -> Applied:
        """`max_version_bytes`: refuse a version larger than this (None: no bound; see
        `check_version_bytes`). `fold_file_uris`: compare locations with `file://` dropped
        (apply version 2), so `/w/t` and `file:///w/t` overlap as the directory they are."""
        name = cmd.table
        self.namespace(name.namespace)  # must be live when applied
        previous = self._tables.get(name, ())
        if previous and previous[-1].live:
            if cmd.if_not_exists:
                existing = previous[-1]
                return {
                    "table": str(name),
                    "table_id": existing.table_id,
                    "created": False,
                    "version": existing.versions[-1].version,
                    "tu": existing.versions[-1].tu,
                }, ()
            raise TableAlreadyExistsError(
                f"table {name} already exists", details={"table": str(name)}
            )
        count = self.live_table_count()
        if count >= limits.MAX_TABLES:
            raise limit_exceeded("MAX_TABLES", limits.MAX_TABLES, count + 1, "tables")
        if cmd.location:
            self._check_location_free(cmd.location, fold_file_uris=fold_file_uris)
        # The schema itself was checked by validate_command before apply dispatched here.
        schema, next_field_id = assign_schema_ids(cmd.schema, 1)
        table_id = self._next_table_id
        tu = tm + dd
        version = SchemaVersion(
            table_id=table_id,
            version=1,
            schema=schema,
            comment=cmd.comment,
            properties=cmd.properties,
            tm=tm,
            tu=tu,
            summary="CREATE TABLE",
            location=cmd.location,
        )
        check_version_bytes(name, version, None, max_version_bytes)
        inc = TableState(
            table_id=table_id,
            name=name,
            format=cmd.format,
            next_field_id=next_field_id,
            versions=(version,),
            tus=(tu,),
            location=cmd.location,
        )
        # --- write ---
        self._tables[name] = (*previous, inc)
        self._live.setdefault(name.namespace, set()).add(name)
        self._next_table_id += 1
        effect = SchemaVersionPublished(table=name, table_id=table_id, version=1, tu=tu)
        result: Result = {
            "table": str(name),
            "table_id": table_id,
            "created": True,
            "version": 1,
            "tu": tu,
            "location": cmd.location,
        }
        return result, (effect,)

    def _check_location_free(self, location: str, *, fold_file_uris: bool = False) -> None:
        """Refuse a location equal to, inside or around a live table's (O(live tables); CREATE is
        rare next to reads)."""
        key = _directory_key if fold_file_uris else _same
        # In name order: `_live` holds sets, whose order can differ between nodes (and after a
        # snapshot restore), and every node must name the same table in the refusal.
        live = sorted((name for names in self._live.values() for name in names), key=str)
        for other in live:
            held = self._tables[other][-1].location
            if held and (
                location_contains(key(held), key(location))
                or location_contains(key(location), key(held))
            ):
                raise InvalidArgumentError(
                    f"location {location!r} overlaps the location {held!r} of table {other}",
                    details={"location": location, "table": str(other), "held": held},
                )

    def drop_table(self, cmd: DropTable, *, tm: int, dd: int) -> Applied:
        name = cmd.table
        incarnations = self._tables.get(name, ())
        if not incarnations or not incarnations[-1].live:
            if cmd.if_exists:
                result: Result = {"table": str(name), "dropped": False}
                if incarnations:  # dropped already: the reply waits until that drop shows
                    result["tu"] = incarnations[-1].dropped_tu
                return result, ()
            raise _table_not_found(name)
        inc = self._dropped(incarnations[-1], tm=tm, dd=dd)
        # --- write ---
        self._tables[name] = (*incarnations[:-1], inc)
        live = self._live[name.namespace]
        live.discard(name)
        if not live:
            del self._live[name.namespace]
        result = {
            "table": str(name),
            "table_id": inc.table_id,
            "dropped": True,
            "tu": tm + dd,
        }
        return result, (TableDropped(table=name, table_id=inc.table_id, tu=tm + dd),)

    def alter_table(
        self,
        cmd: AlterTable,
        *,
        tm: int,
        dd: int,
        before_publish: Callable[[TableState], None] | None = None,
        keep_free: Callable[[int], int] = lambda table_id: 0,
        max_version_bytes: int | None = None,
        spark_case: NameMatch = NameMatch.CASEFOLD,
        one_ttl_key: bool = False,
    ) -> Applied:
        """`before_publish(inc)` runs only when a new version is about to be published, and may
        refuse it by raising (the leases' two-version gate); nothing has changed by then.
        `keep_free(table_id)`: the versions to keep free (see `publish_version`).
        `max_version_bytes`: see `check_version_bytes`. `spark_case` (apply version 5 and up):
        the names a change refers to are matched as Spark matches them (`NameMatch`), and a
        widening must keep what the column's DEFAULT gives older rows (`metastore.schema`).
        `one_ttl_key`: SET and UNSET of `gc.ttl` replace and remove every spelling of the key
        (apply version 5, see `_apply_change`)."""
        name = cmd.table
        inc = self.live_table(name)
        current = inc.versions[-1]
        schema = current.schema
        properties = dict(current.properties)
        next_field_id = inc.next_field_id
        for change in cmd.changes:
            schema, next_field_id = _apply_change(
                schema,
                properties,
                change,
                next_field_id,
                spark_case=spark_case,
                one_ttl_key=one_ttl_key,
            )
            if isinstance(change, AddColumn) and change.parent:
                parent = change.parent
                if spark_case >= NameMatch.JAVA:
                    # The struct's own names: the check below finds them by casefold (from
                    # version 7 by these names themselves), which does not take `İNFO` for
                    # `info` (Java does). Before version 6 such an add was refused as
                    # COLUMN_NOT_FOUND by this check.
                    parent = _actual_path(schema, parent, spark_case)
                _check_nested_name_unused(inc, schema, (*parent, change.column.name), spark_case)
        validate_schema(schema, ids_assigned=True, name_key=unique_names_key(spark_case))
        new_properties = tuple(sorted(properties.items()))
        validate_properties(new_properties, f"properties of table {name}")
        if schema == current.schema and new_properties == current.properties:
            # Nothing changed (e.g. SET TBLPROPERTIES to the values already set): no new version,
            # so no activation delay for the client and no version churn for lease holders.
            return {
                "table": str(name),
                "table_id": inc.table_id,
                "changed": False,
                "version": current.version,
                "tu": current.tu,
            }, ()
        check_pending_names(name, schema, current.pending, name_key=new_name_key(spark_case))
        return self.publish_version(
            inc,
            schema=schema,
            pending=current.pending,
            properties=new_properties,
            next_field_id=next_field_id,
            summary="; ".join(c.to_sql() for c in cmd.changes),
            tm=tm,
            dd=dd,
            before_publish=before_publish,
            keep_free=keep_free(inc.table_id),
            max_version_bytes=max_version_bytes,
            name_key=unique_names_key(spark_case),
        )

    def publish_version(
        self,
        inc: TableState,
        *,
        schema: Schema,
        pending: tuple[PendingColumn, ...],
        next_field_id: int,
        summary: str,
        tm: int,
        dd: int,
        properties: Properties | None = None,
        before_publish: Callable[[TableState], None] | None = None,
        keep_free: int = 0,
        max_version_bytes: int | None = None,
        name_key: NameKey = str.casefold,
    ) -> Applied:
        """Publish the next version of live incarnation `inc` (ALTER TABLE and the steps of
        schema change jobs). Validates first; writes nothing if anything raises. `keep_free`
        versions must remain below MAX_SCHEMA_VERSIONS_PER_TABLE after this one (those the
        table's running schema change jobs still need to finish or be cancelled).
        `name_key`: sibling names must differ under it (`schema.unique_names_key`)."""
        name = inc.name
        current = inc.versions[-1]
        if len(inc.versions) + keep_free >= limits.MAX_SCHEMA_VERSIONS_PER_TABLE:
            kept = f" ({keep_free} kept for its running schema change jobs)" if keep_free else ""
            raise limit_exceeded(
                "MAX_SCHEMA_VERSIONS_PER_TABLE",
                limits.MAX_SCHEMA_VERSIONS_PER_TABLE,
                len(inc.versions) + 1 + keep_free,
                f"schema versions of {name}{kept}",
            )
        validate_schema(schema, ids_assigned=True, name_key=name_key)
        if pending:
            # Pending columns count too: writers write them, and a job's last step (or a
            # cancelled drop) makes them public without adding any, so a step can never be
            # refused by the limit once its job has started.
            count = Schema(columns=schema.columns + tuple(p.column for p in pending)).field_count()
            if count > limits.MAX_COLUMNS_PER_TABLE:
                raise limit_exceeded(
                    "MAX_COLUMNS_PER_TABLE",
                    limits.MAX_COLUMNS_PER_TABLE,
                    count,
                    f"columns incl. nested of {name}, with those of running schema change jobs",
                )
        if before_publish is not None:
            before_publish(inc)
        tu = tm + dd
        version = SchemaVersion(
            table_id=inc.table_id,
            version=current.version + 1,
            schema=schema,
            comment=current.comment,
            properties=current.properties if properties is None else properties,
            tm=tm,
            tu=tu,
            summary=summary,
            location=inc.location,
            pending=tuple(sorted(pending, key=lambda p: p.column.field_id)),
        )
        # Only user changes pass a bound: a running job's later steps must never be refused.
        check_version_bytes(name, version, current, max_version_bytes)
        new_inc = replace(
            inc,
            next_field_id=next_field_id,
            versions=(*inc.versions, version),
            tus=(*inc.tus, tu),
        )
        # --- write ---
        self._tables[name] = (*self._tables[name][:-1], new_inc)
        effect = SchemaVersionPublished(
            table=name, table_id=inc.table_id, version=version.version, tu=tu
        )
        result: Result = {
            "table": str(name),
            "table_id": inc.table_id,
            "changed": True,
            "version": version.version,
            "tu": tu,
        }
        return result, (effect,)

    @staticmethod
    def _dropped(inc: TableState, *, tm: int, dd: int) -> TableState:
        return replace(inc, dropped_tm=tm, dropped_tu=tm + dd)

    # ----------------------------------------------------------------------------------------
    # Invariants
    # ----------------------------------------------------------------------------------------

    def check_invariants(
        self, *, dd: int | None, last_tm: int, name_key: NameKey = str.casefold
    ) -> None:
        """Raise CatalogInvariantError if any invariant from the module docstring fails.
        `name_key`: sibling names differ under it (`schema.unique_names_key`)."""
        if dd is None:
            if not self.is_empty():
                raise CatalogInvariantError("catalog has content but the cluster has no DD")
            return
        live_namespaces = _check_namespaces(self._namespaces, dd=dd, last_tm=last_tm)
        table_ids: set[int] = set()
        live: dict[str, set[TableName]] = {}
        for name, incs in self._tables.items():
            if not incs:
                raise CatalogInvariantError(f"{name}: empty incarnation list")
            for k, inc in enumerate(incs):
                _check_incarnation(name, inc, dd=dd, last_tm=last_tm, name_key=name_key)
                if inc.table_id in table_ids or inc.table_id >= self._next_table_id:
                    raise CatalogInvariantError(f"{name}: table id {inc.table_id} reused or ahead")
                table_ids.add(inc.table_id)
                if k + 1 < len(incs):
                    nxt = incs[k + 1]
                    if inc.dropped_tu is None or nxt.created_tu <= inc.dropped_tu:
                        raise CatalogInvariantError(f"{name}: incarnations overlap")
            if incs[-1].live:
                live.setdefault(name.namespace, set()).add(name)
        if live != self._live:
            raise CatalogInvariantError("live-table index disagrees with the tables")
        if sum(len(v) for v in live.values()) > limits.MAX_TABLES:
            raise CatalogInvariantError("too many live tables")
        for ns_name in live:
            if ns_name not in live_namespaces:
                raise CatalogInvariantError(f"live tables in missing namespace {ns_name}")
        for name, incs in self._tables.items():
            for inc in incs:
                if not _inside_namespace(inc, self._namespaces.get(name.namespace, ())):
                    raise CatalogInvariantError(
                        f"{name} (table id {inc.table_id}) exists where its namespace does not"
                    )
        # Sorted by location + "/", a location and everything below it are adjacent, so checking
        # neighbours finds any overlap in O(n log n).
        held = sorted(
            self._tables[n][-1].location + "/"
            for names in live.values()
            for n in names
            if self._tables[n][-1].location
        )
        for outer, inner in pairwise(held):
            if inner.startswith(outer):
                raise CatalogInvariantError(f"live tables share location {outer[:-1]!r}")

    # ----------------------------------------------------------------------------------------
    # Snapshot form
    # ----------------------------------------------------------------------------------------

    def to_data(self) -> dict[str, object]:
        """Plain data in a canonical order (sorted names), so equal catalogs encode equally.

        `namespace_form` 2: one row per namespace incarnation, oldest first within a name. A
        catalog without it (form 1) kept only live namespaces: see `from_data`."""
        return {
            "namespace_form": NAMESPACE_FORM,
            "next_table_id": self._next_table_id,
            "namespaces": [
                [
                    ns.name,
                    ns.comment,
                    [list(p) for p in ns.properties],
                    ns.created_tm,
                    ns.created_tu,
                    ns.dropped_tm,
                    ns.dropped_tu,
                ]
                for name in sorted(self._namespaces)
                for ns in self._namespaces[name]
            ],
            "tables": [
                [name.namespace, name.name, [_incarnation_to_data(i) for i in self._tables[name]]]
                for name in sorted(self._tables, key=str)
            ],
        }

    @staticmethod
    def from_data(data: object, *, dd: int | None = None) -> Catalog:
        """The inverse of `to_data`. `dd` (the cluster's DD in HLC units) is needed only for the
        form-1 data of older snapshots, whose namespaces had no activation time."""
        keys = {"next_table_id", "namespaces", "tables"}
        if not isinstance(data, dict) or set(data) not in (keys, keys | {"namespace_form"}):
            raise MalformedSnapshotError("catalog must be a map of next_table_id/namespaces/tables")
        form = data.get("namespace_form", 1)
        if form not in (1, NAMESPACE_FORM):
            raise MalformedSnapshotError(f"unknown catalog namespace form {form!r}")
        catalog = Catalog()
        catalog._next_table_id = _snap_int(data["next_table_id"])
        for item in _snap_list(data["tables"]):
            row = _snap_list(item, 3)
            try:
                name = TableName(namespace=_snap_str(row[0]), name=_snap_str(row[1]))
            except MetastoreError as e:
                raise MalformedSnapshotError(f"bad table name: {e.message}") from None
            incs = tuple(_incarnation_from_data(name, i) for i in _snap_list(row[2]))
            catalog._tables[name] = incs
            if incs and incs[-1].live:
                catalog._live.setdefault(name.namespace, set()).add(name)
        if form == NAMESPACE_FORM:
            for item in _snap_list(data["namespaces"]):
                ns = _namespace_from_data(item)
                catalog._namespaces[ns.name] = (*catalog._namespaces.get(ns.name, ()), ns)
        else:
            if dd is None and data["namespaces"]:
                raise MalformedSnapshotError("a form-1 catalog with namespaces needs the DD")
            catalog._namespaces = _namespaces_from_form1(
                _snap_list(data["namespaces"]), catalog._tables, dd or 0
            )
        return catalog

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Catalog) and (
            self._namespaces,
            self._tables,
            self._live,
            self._next_table_id,
        ) == (other._namespaces, other._tables, other._live, other._next_table_id)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _actual_path(schema: Schema, path: tuple[str, ...], spark_case: NameMatch) -> tuple[str, ...]:
    """The names the columns and fields along `path` have, each matched as `spark_case` says."""
    return tuple(
        schema.lookup(path[: depth + 1], spark_case=spark_case).name for depth in range(len(path))
    )


def _check_nested_name_unused(
    inc: TableState, schema: Schema, path: tuple[str, ...], spark_case: NameMatch
) -> None:
    """Refuse a nested field at `path` whose name an older field of the same struct had (one
    dropped since). Readers match nested fields by name (only top-level columns carry field
    ids to them), so rows written before the drop would show the old field's values under the
    new one. From apply version 7 (`path` holds the fields' own names) "that name" is Java's
    equalsIgnoreCase, as a new name's uniqueness; before, the first casefold match."""
    if spark_case >= NameMatch.JAVA_UNIQUE:
        _check_nested_name_unused_v7(inc, schema, path)
        return
    added = schema.lookup(path)
    struct_id = schema.lookup(path[:1]).field_id
    for version in inc.versions:
        try:
            old = version.schema.lookup(path)
            if version.schema.lookup(path[:1]).field_id != struct_id:
                continue  # another column of that name: files keep it apart by field id
        except ColumnNotFoundError:
            continue
        if old.field_id != added.field_id:
            raise UnsupportedSchemaChangeError(
                f"cannot add the nested field {path_sql(path)}: version {version.version} had a "
                "field of that name, and older rows would show its values under the new one "
                "(nested fields are matched by name). Choose another name",
                details={"column": list(path), "reason": "nested_name_reused"},
            )


def _check_nested_name_unused_v7(inc: TableState, schema: Schema, path: tuple[str, ...]) -> None:
    added_id = next(_members_named(schema.columns, path, exact_name)).field_id
    struct_id = next(_members_named(schema.columns, path[:1], exact_name)).field_id
    for version in inc.versions:
        # The same column, by the field id that keeps its files apart from any other's.
        same = [c.type for c in version.schema.columns if c.field_id == struct_id]
        if not same or not isinstance(same[0], StructType):
            continue
        for old in _members_named(same[0].fields, path[1:], java_case_key):
            if old.field_id != added_id:
                raise UnsupportedSchemaChangeError(
                    f"cannot add the nested field {path_sql(path)}: version {version.version} "
                    f"had a field of that name ({old.name}), and older rows would show its "
                    "values under the new one (nested fields are matched by name). Choose "
                    "another name",
                    details={"column": list(path), "reason": "nested_name_reused"},
                )


def _members_named(
    members: Sequence[Column | StructField], names: tuple[str, ...], key: NameKey
) -> Iterator[Column | StructField]:
    """The members at the end of `names`, each step matched under `key`, in schema order."""
    wanted = key(names[0])
    for member in members:
        if key(member.name) != wanted:
            continue
        if len(names) == 1:
            yield member
        elif isinstance(member.type, StructType):
            yield from _members_named(member.type.fields, names[1:], key)


def _apply_change(
    schema: Schema,
    properties: dict[str, str],
    change: TableChange,
    next_field_id: int,
    *,
    spark_case: NameMatch,
    one_ttl_key: bool = False,
) -> tuple[Schema, int]:
    """Apply one change to (schema, properties). `properties` is updated in place (it is a
    private copy); the schema is returned with the next free field id.

    `one_ttl_key` (apply version 5): SET and UNSET of the GC TTL key (`gc.ttl`, which GC reads
    case-insensitively) replace and remove it in every spelling. The DDL writes only `gc.ttl`
    since it was normalised, but a table created before that may hold 'GC.TTL': SET 'gc.ttl'
    then added a second key, and GC went on using the first in sorted order (the old one), and
    UNSET 'gc.ttl' said the key was not set."""
    sc = spark_case
    match change:
        case AddColumn(parent=parent, column=column, position=position):
            return add_column(
                schema,
                parent=parent,
                column=column,
                position=position,
                next_field_id=next_field_id,
                spark_case=sc,
            )
        case RenameColumn(path=path, new_name=new_name):
            return rename_column(schema, path=path, new_name=new_name, spark_case=sc), next_field_id
        case DropColumn(path=path, if_exists=if_exists):
            if if_exists:
                try:
                    schema.lookup(path, spark_case=sc)
                except ColumnNotFoundError:
                    return schema, next_field_id
            return drop_column(schema, path=path, spark_case=sc), next_field_id
        case AlterColumnType(path=path, new_type=new_type):
            # The DEFAULT kept across a widening: apply version 5, like `spark_case`.
            changed = alter_column_type(
                schema, path=path, new_type=new_type, spark_case=sc, keep_default=bool(sc)
            )
            return changed, next_field_id
        case SetNullability(path=path, nullable=nullable):
            changed = set_nullability(schema, path=path, nullable=nullable, spark_case=sc)
            return changed, next_field_id
        case SetColumnComment(path=path, comment=comment):
            changed = set_column_comment(schema, path=path, comment=comment, spark_case=sc)
            return changed, next_field_id
        case MoveColumn(path=path, position=position):
            return move_column(schema, path=path, position=position, spark_case=sc), next_field_id
        case SetTableProperties(properties=props):
            if one_ttl_key and any(k.lower() == GC_TTL_PROPERTY for k, _ in props):
                _drop_ttl_spellings(properties)
            properties.update(props)
            return schema, next_field_id
        case UnsetTableProperties(keys=keys, if_exists=if_exists):
            if one_ttl_key and any(k.lower() == GC_TTL_PROPERTY for k in keys):
                spellings = [k for k in properties if k.lower() == GC_TTL_PROPERTY]
                keys = tuple(k for k in keys if k.lower() != GC_TTL_PROPERTY) + (
                    tuple(spellings) or (GC_TTL_PROPERTY,)
                )
            missing = [k for k in keys if k not in properties]
            if missing and not if_exists:
                raise InvalidArgumentError(
                    f"cannot unset properties that are not set: {missing}; use IF EXISTS",
                    details={"keys": missing},
                )
            for key in keys:
                properties.pop(key, None)
            return schema, next_field_id


def _drop_ttl_spellings(properties: dict[str, str]) -> None:
    for key in [k for k in properties if k.lower() == GC_TTL_PROPERTY]:
        del properties[key]


def check_pending_names(
    name: TableName,
    schema: Schema,
    pending: tuple[PendingColumn, ...],
    *,
    name_key: NameKey = str.casefold,
) -> None:
    """No public column may take the name of a column a job is adding or dropping, and no two
    pending columns share a name (equal under `name_key`: `schema.new_name_key` of the apply
    version where a name is new, `unique_names_key` for a state's check): writers pinned to
    the version fill the pending one under that name. The older job (first in `pending`'s
    order of arrival) is the one named."""
    taken: dict[str, PendingColumn] = {}
    clash: PendingColumn | None = None
    for p in pending:
        clash = clash or taken.get(name_key(p.column.name))
        taken.setdefault(name_key(p.column.name), p)
    for c in schema.columns:
        clash = clash or taken.get(name_key(c.name))
    if clash is not None:
        action = "added" if clash.action == ADDING else "dropped"
        raise SchemaJobConflictError(
            f"{name}: column {clash.column.name} is being {action} by schema change job "
            f"{clash.job_id}; wait for it to finish (metastore job show {clash.job_id}) or "
            "cancel it",
            details={"table": str(name), "column": clash.column.name, "job_id": clash.job_id},
        )


def _exists_at(inc: TableState, top: int) -> bool:
    return inc.tus[0] <= top and (inc.dropped_tu is None or top < inc.dropped_tu)


def _ns_exists_at(ns: Namespace, top: int) -> bool:
    return ns.created_tu <= top and (ns.dropped_tu is None or top < ns.dropped_tu)


def _inside_namespace(inc: TableState, namespaces: tuple[Namespace, ...]) -> bool:
    """Whether [created_tu, dropped_tu) of `inc` lies within one incarnation of its namespace."""
    for ns in reversed(namespaces):
        if ns.created_tu <= inc.created_tu:
            if ns.dropped_tu is None:
                return True
            return inc.dropped_tu is not None and inc.dropped_tu <= ns.dropped_tu
    return False


def _check_namespaces(
    namespaces: dict[str, tuple[Namespace, ...]], *, dd: int, last_tm: int
) -> set[str]:
    """Check every namespace incarnation; return the names of the live ones."""
    live: set[str] = set()
    for name, incs in namespaces.items():
        if not incs:
            raise CatalogInvariantError(f"namespace {name}: empty incarnation list")
        previous: Namespace | None = None
        for ns in incs:
            if ns.name != name:
                raise CatalogInvariantError(f"namespace {ns.name} stored under {name}")
            if ns.created_tu != ns.created_tm + dd or ns.created_tm > last_tm:
                raise CatalogInvariantError(f"namespace {name}: created_tu != created_tm + DD")
            if (ns.dropped_tm is None) != (ns.dropped_tu is None):
                raise CatalogInvariantError(f"namespace {name}: half-dropped")
            if ns.dropped_tm is not None and (
                ns.dropped_tm <= ns.created_tm
                or ns.dropped_tm > last_tm
                or ns.dropped_tu != ns.dropped_tm + dd
            ):
                raise CatalogInvariantError(f"namespace {name}: drop not after create or not +DD")
            if previous is not None and (
                previous.dropped_tm is None or ns.created_tm <= previous.dropped_tm
            ):
                raise CatalogInvariantError(f"namespace {name}: incarnations overlap")
            previous = ns
        if incs[-1].live:
            live.add(name)
    if len(live) > limits.MAX_NAMESPACES:
        raise CatalogInvariantError("too many namespaces")
    return live


def _table_not_found(table: TableName) -> TableNotFoundError:
    return TableNotFoundError(f"table {table} does not exist", details={"table": str(table)})


def _namespace_not_found(namespace: str) -> NamespaceNotFoundError:
    return NamespaceNotFoundError(
        f"namespace {namespace} does not exist", details={"namespace": namespace}
    )


def _check_incarnation(
    name: TableName, inc: TableState, *, dd: int, last_tm: int, name_key: NameKey
) -> None:
    def fail(what: str) -> CatalogInvariantError:
        return CatalogInvariantError(f"{name} (table id {inc.table_id}): {what}")

    if inc.name != name:
        raise fail("stored under another name")
    if not inc.versions or len(inc.versions) > limits.MAX_SCHEMA_VERSIONS_PER_TABLE:
        raise fail("version count out of range")
    if inc.tus != tuple(v.tu for v in inc.versions):
        raise fail("tu index does not mirror the versions")
    if any(v.location != inc.location for v in inc.versions):
        raise fail("a version's location differs from the incarnation's")
    try:
        validate_location(inc.location, "location")
    except MetastoreError as e:
        raise fail(e.message) from e
    previous: SchemaVersion | None = None
    retired: set[int] = set()  # ids that left the schema: they must never come back
    for i, v in enumerate(inc.versions):
        if v.version != i + 1 or v.table_id != inc.table_id:
            raise fail(f"version {v.version} at position {i}")
        if v.tu != v.tm + dd:
            raise fail(f"version {v.version}: tu != tm + DD")
        if v.tm > last_tm:
            raise fail(f"version {v.version}: tm after last applied tm")
        if previous is not None and v.tm <= previous.tm:
            raise fail(f"version {v.version}: tm not increasing")
        try:
            validate_schema(v.schema, ids_assigned=True, name_key=name_key)
            validate_properties(v.properties, "properties")
        except MetastoreError as e:
            raise fail(f"version {v.version}: {e.message}") from e
        ids = set(v.schema.field_ids())
        pending_ids = [p.column.field_id for p in v.pending]
        if pending_ids != sorted(set(pending_ids)) or ids & set(pending_ids):
            raise fail(f"version {v.version}: pending field ids repeat or are public")
        try:
            check_pending_names(name, v.schema, v.pending, name_key=name_key)
        except MetastoreError as e:
            raise fail(f"version {v.version}: {e.message}") from e
        if any(p.state not in PENDING_STATES or p.action not in PENDING_ACTIONS for p in v.pending):
            raise fail(f"version {v.version}: bad pending column state")
        ids |= set(pending_ids)
        if max(ids) >= inc.next_field_id:
            raise fail(f"version {v.version}: field id not below next_field_id")
        if ids & retired:
            raise fail(f"version {v.version}: reuses retired field ids {sorted(ids & retired)}")
        if previous is not None:
            before = set(previous.schema.field_ids()) | {
                p.column.field_id for p in previous.pending
            }
            retired |= before - ids
        previous = v
    if (inc.dropped_tm is None) != (inc.dropped_tu is None):
        raise fail("half-dropped")
    if inc.dropped_tm is not None:
        if inc.dropped_tm <= inc.versions[-1].tm or inc.dropped_tm > last_tm:
            raise fail("drop not after the last version or after last applied tm")
        if inc.dropped_tu != inc.dropped_tm + dd:
            raise fail("dropped_tu != dropped_tm + DD")


def _namespace_from_data(data: object) -> Namespace:
    row = _snap_list(data, 7)
    return Namespace(
        name=_snap_str(row[0]),
        comment=_snap_opt_str(row[1]),
        properties=_snap_properties(row[2]),
        created_tm=_snap_int(row[3]),
        created_tu=_snap_int(row[4]),
        dropped_tm=_snap_opt_int(row[5]),
        dropped_tu=_snap_opt_int(row[6]),
    )


def _namespaces_from_form1(
    rows: list[object], tables: dict[TableName, tuple[TableState, ...]], dd: int
) -> dict[str, tuple[Namespace, ...]]:
    """Namespaces from a form-1 catalog: `[name, comment, properties, created_tm]` per live
    namespace, dropped ones forgotten.

    A live namespace gets created_tu = created_tm + DD: exactly what replaying its CREATE
    NAMESPACE gives now, so a node restored from an old snapshot and one that replays the log
    agree (created_tu = 0 would make them answer differently for T < created_tm + DD, and break
    tu = tm + DD). Table incarnations that no live namespace covers (their namespace was dropped,
    or dropped and re-created, before the snapshot) get one dropped incarnation per name that
    spans them: from the first one's creation to the last one's drop. The real times are lost;
    this is the smallest history in which every table lies inside its namespace, and every node
    that loads the same snapshot rebuilds the same one."""
    out: dict[str, tuple[Namespace, ...]] = {}
    for item in rows:
        row = _snap_list(item, 4)
        created_tm = _snap_int(row[3])
        ns = Namespace(
            name=_snap_str(row[0]),
            comment=_snap_opt_str(row[1]),
            properties=_snap_properties(row[2]),
            created_tm=created_tm,
            created_tu=created_tm + dd,
        )
        out[ns.name] = (ns,)
    uncovered: dict[str, list[TableState]] = {}
    for name, incs in tables.items():
        for inc in incs:
            if not _inside_namespace(inc, out.get(name.namespace, ())):
                uncovered.setdefault(name.namespace, []).append(inc)
    for ns_name, orphans in uncovered.items():
        if any(inc.dropped_tm is None for inc in orphans):
            raise MalformedSnapshotError(f"live tables in missing namespace {ns_name}")
        created_tm = min(inc.versions[0].tm for inc in orphans)
        dropped_tm = max(inc.dropped_tm or 0 for inc in orphans)
        synthesized = Namespace(
            name=ns_name,
            comment=None,
            properties=(),
            created_tm=created_tm,
            created_tu=created_tm + dd,
            dropped_tm=dropped_tm,
            dropped_tu=dropped_tm + dd,
        )
        out[ns_name] = (synthesized, *out.get(ns_name, ()))
    return out


def version_bytes(v: SchemaVersion) -> int:
    """The encoded size of a schema version as stored: what MAX_SCHEMA_VERSION_BYTES bounds."""
    return len(msgpack.packb(_version_to_data(v), use_bin_type=True))


def check_version_bytes(
    name: TableName, new: SchemaVersion, current: SchemaVersion | None, max_bytes: int | None
) -> None:
    """Refuse a version above `max_bytes` unless it is no larger than the current one (so a
    table already beyond the bound can still shrink). None: no bound (apply version 1)."""
    if max_bytes is None:
        return
    size = version_bytes(new)
    if size <= max_bytes or (current is not None and size <= version_bytes(current)):
        return
    raise limit_exceeded(
        "MAX_SCHEMA_VERSION_BYTES",
        max_bytes,
        size,
        f"encoded bytes of {name}'s schema (columns, comments, defaults, properties)",
    )


def _directory_key(location: str) -> str:
    """A canonical location with `file://` dropped: the directory it names, as readers and GC
    take it (`file:///w/t` is `/w/t`)."""
    return location.removeprefix("file://")


def _same(location: str) -> str:
    return location


def _version_to_data(v: SchemaVersion) -> list[object]:
    return [
        v.version,
        v.tm,
        v.tu,
        v.comment,
        [list(p) for p in v.properties],
        v.summary,
        [column_to_data(c) for c in v.schema.columns],
        # An 8th item only when a job has pending columns (older snapshots have 7).
        *(
            [[[column_to_data(p.column), p.state, p.job_id, p.action] for p in v.pending]]
            if v.pending
            else []
        ),
    ]


def _incarnation_to_data(inc: TableState) -> list[object]:
    return [
        inc.table_id,
        inc.format,
        inc.next_field_id,
        inc.dropped_tm,
        inc.dropped_tu,
        [_version_to_data(v) for v in inc.versions],
        inc.location,
    ]


def _incarnation_from_data(name: TableName, data: object) -> TableState:
    row = _snap_list(data)
    if len(row) not in (6, 7):  # 6: snapshot format 1, before table locations
        raise MalformedSnapshotError("incarnation must be a list of 7 items")
    location = _snap_str(row[6]) if len(row) == 7 else ""
    table_id = _snap_int(row[0])
    versions = []
    for item in _snap_list(row[5]):
        v = _snap_list(item)
        if len(v) not in (7, 8):
            raise MalformedSnapshotError("schema version must be a list of 7 or 8 items")
        try:
            columns = tuple(column_from_data(c) for c in _snap_list(v[6]))
            pending = tuple(_pending_from_data(p) for p in _snap_list(v[7])) if len(v) == 8 else ()
        except MetastoreError as e:
            raise MalformedSnapshotError(f"bad column: {e.message}") from None
        versions.append(
            SchemaVersion(
                table_id=table_id,
                version=_snap_int(v[0]),
                tm=_snap_int(v[1]),
                tu=_snap_int(v[2]),
                comment=_snap_opt_str(v[3]),
                properties=_snap_properties(v[4]),
                summary=_snap_str(v[5]),
                schema=Schema(columns=columns),
                location=location,
                pending=pending,
            )
        )
    if not versions:
        raise MalformedSnapshotError(f"{name}: incarnation without versions")
    return TableState(
        table_id=table_id,
        name=name,
        format=_snap_str(row[1]),
        next_field_id=_snap_int(row[2]),
        dropped_tm=_snap_opt_int(row[3]),
        dropped_tu=_snap_opt_int(row[4]),
        versions=tuple(versions),
        tus=tuple(v.tu for v in versions),
        location=location,
    )


def _pending_from_data(data: object) -> PendingColumn:
    row = _snap_list(data, 4)
    state, action = _snap_str(row[1]), _snap_str(row[3])
    if state not in PENDING_STATES or action not in PENDING_ACTIONS:
        raise MalformedSnapshotError(f"bad pending column state {state!r}/{action!r}")
    return PendingColumn(
        column=column_from_data(row[0]), state=state, job_id=_snap_int(row[2]), action=action
    )


def _snap_list(value: object, length: int | None = None) -> list[object]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise MalformedSnapshotError(f"expected a list of length {length}")
    return value


def _snap_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedSnapshotError("expected an integer")
    return value


def _snap_opt_int(value: object) -> int | None:
    return None if value is None else _snap_int(value)


def _snap_str(value: object) -> str:
    if not isinstance(value, str):
        raise MalformedSnapshotError("expected a string")
    return value


def _snap_opt_str(value: object) -> str | None:
    return None if value is None else _snap_str(value)


def _snap_properties(value: object) -> Properties:
    try:
        return properties_from_data(_snap_list(value))
    except MetastoreError as e:
        raise MalformedSnapshotError(f"bad properties: {e.message}") from None


def _count(n: int, noun: str) -> str:
    """`1 table`, `2 tables`: a count for a message."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
