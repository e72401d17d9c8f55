"""The schema metastore."""
