"""EMR step entry point: `spark-submit ... emr_step.py jobs.<module> [job args]` runs that job's main.

spark-submit needs a file for the driver; the jobs themselves come from the step's `spark.archives`
environment (unpacked as `./pyenv` and put on PYTHONPATH), so this file only dispatches.
"""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str]) -> int:
    if not argv or not argv[0].startswith("jobs."):
        print("usage: emr_step.py jobs.<module> [job args]", file=sys.stderr)
        return 2
    return importlib.import_module(argv[0]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
