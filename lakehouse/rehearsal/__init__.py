"""The EMR rehearsal (`make rehearse`): what the cluster would run, run here from the synthesized
dev cloud assembly and the packaged artifact only. Start at `scenario.py`."""
