"""Job `replay`: rejects that today's validation lets through -> the fact table, each exactly once."""
