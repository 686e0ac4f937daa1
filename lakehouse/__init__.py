"""Near-real-time Apache Iceberg lakehouse: CLI, typed config and the embedded local stack."""
