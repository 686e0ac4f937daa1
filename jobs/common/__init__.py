"""Shared by the jobs: arguments -> config, run modes, progress keys and commits, lake tables, the Kafka
client, metrics, the StreamingJob protocol, the Spark session."""
