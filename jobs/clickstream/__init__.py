"""The clickstream ingest job's parts: schema, validation, Kafka source, products dimension."""
