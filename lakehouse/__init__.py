"""The operator side: the `lakehouse` CLI, the embedded local stack, the demo, the AWS commands and
the EMR rehearsal. It may import jobs/ and infra/; neither imports it (tests/test_layers.py)."""
