"""The streaming application (`lakehouse run streaming`): cdc, ingest and views in one Spark application."""
