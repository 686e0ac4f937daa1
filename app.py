#!/usr/bin/env python3
"""CDK entry point: `cdk synth|deploy|destroy -c env=dev|prod` (default dev).

See infra/README.md (deploy, destroy, park).
"""

import os
import sys
from pathlib import Path

# jsii (started by the first `import aws_cdk`) runs $JSII_NODE, else `node` from PATH. Prefer the
# Node 22 LTS `make setup` pins in node_modules (the image's /usr/bin/node 20 is end-of-life for jsii,
# which then prints a banner), also when this runs outside make: `cdk synth` by hand, `python app.py`.
_REPO_NODE = Path(__file__).resolve().parent / "node_modules" / ".bin" / "node"
if "JSII_NODE" not in os.environ and _REPO_NODE.exists():
    os.environ["JSII_NODE"] = str(_REPO_NODE)

from aws_cdk import App  # noqa: E402  (after JSII_NODE is chosen)

from infra.lakehouse_app import build_lakehouse, config_from_context  # noqa: E402
from jobs.config import ConfigError  # noqa: E402


def main() -> None:
    app = App()
    try:
        config = config_from_context(app)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    build_lakehouse(app, config)
    app.synth()


if __name__ == "__main__":
    main()
