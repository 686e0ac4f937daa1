"""Plumbing shared by the jobs: arguments -> config, run modes, snapshot-summary progress, retries."""
