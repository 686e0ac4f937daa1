"""Table maintenance (`lakehouse run maintain`): which snapshots may expire (`retention`, pure) and the
Iceberg procedures and metadata reads (`procedures`)."""
