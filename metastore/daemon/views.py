"""Catalog values as protocol maps (docs/protocol.md). Pure functions, no I/O."""

from __future__ import annotations

from metastore.catalog import Namespace, SchemaVersion, TableDescription
from metastore.schema import Schema
from metastore.txn import CommitRecord, FileEntry


def file_view(f: FileEntry) -> dict[str, object]:
    return {
        "path": f.path,
        "size_bytes": f.size_bytes,
        "row_count": f.row_count,
        "added_ts": f.added_ts,
    }


def commit_view(r: CommitRecord) -> dict[str, object]:
    return {
        "ts": r.ts,
        "tm": r.tm,
        "txn_id": r.txn_id,
        "tables": [str(t) for t in r.tables],
        "files_added": r.files_added,
        "files_removed": r.files_removed,
        "rows_added": r.rows_added,
    }


def schema_view(schema: Schema) -> dict[str, object]:
    return {
        "columns": [
            {
                "field_id": c.field_id,
                "name": c.name,
                "type": c.type.to_sql(),
                "nullable": c.nullable,
                "comment": c.comment,
                "default": c.default_sql,
            }
            for c in schema.columns
        ],
        "ddl": schema.to_spark_ddl(),
    }


def version_view(table: str, v: SchemaVersion) -> dict[str, object]:
    return {
        "table": table,
        "table_id": v.table_id,
        "version": v.version,
        "tm": v.tm,
        "tu": v.tu,
        "change": v.summary,
        "comment": v.comment,
        "properties": dict(v.properties),
        "location": v.location,
        "schema": schema_view(v.schema),
        # Columns a schema change job is adding or dropping (hidden from readers). A writer
        # pinned to this version writes `write_schema` (public + write-only columns).
        "pending": [
            {
                "field_id": p.column.field_id,
                "name": p.column.name,
                "state": p.state,
                "action": p.action,
                "job_id": p.job_id,
            }
            for p in v.pending
        ],
        **({"write_schema": schema_view(v.write_schema)} if v.write_schema != v.schema else {}),
    }


def description_view(d: TableDescription) -> dict[str, object]:
    out = version_view(str(d.table), d.current)
    out.update(
        {
            "format": d.format,
            "created_tu": d.created_tu,
            "versions": d.version_count,
        }
    )
    return out


def namespace_view(ns: Namespace) -> dict[str, object]:
    return {
        "name": ns.name,
        "comment": ns.comment,
        "properties": dict(ns.properties),
        "created_tm": ns.created_tm,
        "created_tu": ns.created_tu,
    }
