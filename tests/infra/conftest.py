"""Synthesizes the CDK app once per environment for the whole tests/infra session.

No AWS credentials, no CLI: the app is built in-process with the context of cdk.json (the feature
flags the CLI would pass) and `-c env=<env>`, exactly like `cdk synth -c env=<env>`. cdk-nag runs as
a validation plugin during synth; if it reports findings, the report is kept for the nag test and
the app is rebuilt without the plugin so the other tests still say what else is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from infra.config import DeploymentConfig
from infra.lakehouse_app import build_lakehouse, config_from_context
from infra.stacks import LakehouseStacks

REPO_ROOT = Path(__file__).resolve().parents[2]
CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")


@dataclass
class SynthesizedEnv:
    config: DeploymentConfig
    app: App
    stacks: LakehouseStacks
    outdir: Path
    nag_report: str | None
    templates: dict[str, dict] = field(default_factory=dict)  # concern -> template JSON

    def template(self, concern: str) -> Template:
        return Template.from_json(self.templates[concern])

    def acknowledgements(self) -> list[tuple[str, str, str]]:
        """(construct path, rule id, reason) of every acknowledged validation rule."""
        found = []
        for construct in self.app.node.find_all():
            for entry in construct.node.metadata:
                if entry.type == "aws:cdk:acknowledged-rules":
                    found += [(construct.node.path, rule, reason) for rule, reason in entry.data.items()]
        return found


def cdk_json_context() -> dict:
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def _build(
    env_name: str, outdir: Path, *, nag: bool, context: dict | None = None
) -> tuple[App, DeploymentConfig, LakehouseStacks]:
    context = {**cdk_json_context(), "env": env_name, **(context or {})}
    app = App(context=context, outdir=str(outdir))
    # An empty environment: no CDK_DEFAULT_ACCOUNT/REGION, as on a machine without credentials.
    config = config_from_context(app, environ={})
    return app, config, build_lakehouse(app, config, nag=nag)


def synthesize(env_name: str, outdir: Path, context: dict | None = None) -> SynthesizedEnv:
    app, config, stacks = _build(env_name, outdir, nag=True, context=context)
    nag_report = None
    try:
        app.synth()
    except RuntimeError as error:  # jsii surfaces ValidationFailed as RuntimeError
        reports = sorted(outdir.glob("*validation-report*"))
        nag_report = "\n".join(p.read_text() for p in reports) or str(error)
        outdir = outdir.with_name(outdir.name + "-no-nag")
        app, config, stacks = _build(env_name, outdir, nag=False, context=context)
        app.synth()
    env = SynthesizedEnv(config=config, app=app, stacks=stacks, outdir=outdir, nag_report=nag_report)
    for concern, stack in zip(CONCERNS, stacks.all, strict=True):
        env.templates[concern] = json.loads((outdir / stack.template_file).read_text())
    return env


@pytest.fixture(scope="session")
def dev(tmp_path_factory) -> SynthesizedEnv:
    return synthesize("dev", tmp_path_factory.mktemp("cdk") / "dev")


@pytest.fixture(scope="session")
def prod(tmp_path_factory) -> SynthesizedEnv:
    return synthesize("prod", tmp_path_factory.mktemp("cdk") / "prod")


@pytest.fixture(scope="session")
def parked_dev(tmp_path_factory) -> SynthesizedEnv:
    """dev as `lakehouse aws park` deploys it (`-c parked=true`)."""
    return synthesize("dev", tmp_path_factory.mktemp("cdk") / "dev-parked", {"parked": "true"})


@pytest.fixture(scope="session", params=["dev", "prod"])
def synthesized(request) -> SynthesizedEnv:
    return request.getfixturevalue(request.param)
