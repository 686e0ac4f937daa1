"""How this checkout runs the CDK CLI: the CLI and Node 22 `make setup` installed in node_modules,
cdk.json's `python3` this venv's (one place for `lakehouse aws` and the release baseline)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cdk_environment(repo: Path, region: str | None = None, account_free: bool = False) -> dict[str, str]:
    """The process environment for `cdk` run from `repo`'s checkout. `region`: the session's;
    `account_free`: without CDK_DEFAULT_* (a synth that must not depend on who runs it)."""
    binaries = os.pathsep.join((str(repo / "node_modules" / ".bin"), str(Path(sys.executable).parent)))
    env = {k: v for k, v in os.environ.items() if not (account_free and k.startswith("CDK_DEFAULT_"))}
    env.update(PATH=f"{binaries}{os.pathsep}{os.environ.get('PATH', '')}",
               JSII_NODE=str(repo / "node_modules" / ".bin" / "node"))  # fmt: skip
    if region:
        env.update(AWS_REGION=region, AWS_DEFAULT_REGION=region)
    return env
