"""Table maintenance for `jobs/maintain.py`: which snapshots may expire (`retention`, pure) and the
Iceberg procedures and metadata reads (`procedures`)."""
