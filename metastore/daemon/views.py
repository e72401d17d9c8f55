"""Catalog values as protocol maps (docs/protocol.md). Pure functions, no I/O."""

from __future__ import annotations

from metastore.catalog import Namespace, SchemaVersion, TableDescription
from metastore.schema import Schema


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
        "schema": schema_view(v.schema),
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
    }
