"""The ingest job (`lakehouse run ingest`): Kafka clicks -> the click and rejects tables. `job.py` is
the job; validation, the Kafka source, offsets and the products dimension are its parts."""
