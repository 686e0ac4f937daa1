#!/usr/bin/env python3
"""CDK entry point: `cdk synth|deploy|destroy -c env=dev|prod` (default dev).

See README "Deploy and destroy".
"""

import sys

from aws_cdk import App

from infra.lakehouse_app import build_lakehouse, config_from_context
from jobs.config import ConfigError


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
