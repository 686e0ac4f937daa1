"""The click generator (`lakehouse gendata`): ClickEvents, and malformed records on request, to Kafka."""
