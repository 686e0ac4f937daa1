"""The CDC job (`lakehouse run cdc`): MySQL/MariaDB binlog -> Iceberg dimension tables. `sync.py` is
the job (`CdcSync`); the other modules are its pure parts and its reads of the source."""
