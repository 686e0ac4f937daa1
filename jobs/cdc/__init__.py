"""MySQL/MariaDB binlog CDC into Iceberg dimension tables; `jobs.cdc_sync` wires these modules."""
