"""EMR step entry point: `spark-submit ... emr_step.py <job> [job args]` runs that job's main.

spark-submit needs a file for the driver; the jobs themselves come from the step's `spark.archives`
environment (unpacked as `./pyenv` and put on PYTHONPATH), so this file only dispatches by the
job's name in `jobs/registry.py`. A step names the entry file and archive of its own build
(`emr/<version>/`), so a step submitted by an older deploy never meets newer job names.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from jobs.registry import JOBS

    if not argv or argv[0] not in JOBS:
        print(f"usage: emr_step.py <{'|'.join(JOBS)}> [job args]", file=sys.stderr)
        return 2
    job = JOBS[argv[0]]
    run = job.main()
    # Which build ran: the step's log names the archive the job came from.
    print(
        f"emr_step: running {job.name} from {sys.modules[run.__module__].__file__}",
        file=sys.stderr,
        flush=True,
    )
    return run(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
