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
    job = importlib.import_module(argv[0])
    # Which build ran: the step's log names the archive the job came from.
    print(f"emr_step: running {argv[0]} from {job.__file__}", file=sys.stderr, flush=True)
    return job.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
