"""Job `verify`: reconcile the lake with its sources (Kafka, MySQL) and the views with the clicks."""
