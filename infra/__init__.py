"""AWS CDK app of the lakehouse: per-environment stacks composed from one construct per concern.

Start at `app.py` -> `infra.lakehouse_app.build_lakehouse` -> `infra.stacks` (the stacks) ->
`infra.constructs.*` (one concern each). Per-environment values live in `infra.config.DeploymentConfig`.
"""
