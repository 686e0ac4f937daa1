"""`spark-submit` on the rehearsal's EMR node: YARN cluster mode, played on a standalone cluster.

Spark's standalone master refuses cluster deploy mode for Python applications, so this stand-in
does for the driver what YARN's application master does in cluster mode: it unpacks the
`spark.archives` into the driver's working directory under their aliases, puts the
`spark.yarn.appMasterEnv.*` variables into the driver's environment, and then runs Spark's own
`spark-submit` in client mode from that directory. Executors unpack the archives themselves.
Everything else in the command line passes through unchanged.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

APP_MASTER_ENV = "spark.yarn.appMasterEnv."
# spark-submit's options that take a value; the first other argument is the application.
OPTIONS_WITH_VALUES = frozenset(
    "--master --deploy-mode --class --name --jars --packages --exclude-packages --repositories "
    "--py-files --files --archives --conf -c --properties-file --driver-memory --driver-java-options "
    "--driver-library-path --driver-class-path --executor-memory --proxy-user --driver-cores "
    "--total-executor-cores --executor-cores --num-executors --queue --principal --keytab".split()
)


def plan(argv: list[str]) -> tuple[list[str], dict[str, str], list[tuple[str, str]]]:
    """(client-mode arguments, driver environment, archives as (path, alias))."""
    args: list[str] = []
    env: dict[str, str] = {}
    archives: list[tuple[str, str]] = []
    deploy_mode = "client"
    position = 0
    while position < len(argv) and argv[position].startswith("-"):
        option = argv[position]
        value = argv[position + 1] if option in OPTIONS_WITH_VALUES and position + 1 < len(argv) else None
        position += 2 if value is not None else 1
        if option == "--deploy-mode":
            deploy_mode = str(value)
            continue
        if option in ("--conf", "-c") and value is not None:
            key, _, setting = value.partition("=")
            if key.startswith(APP_MASTER_ENV):
                env[key.removeprefix(APP_MASTER_ENV)] = setting
            if key == "spark.archives":
                for entry in setting.split(","):
                    path, _, alias = entry.partition("#")
                    archives.append((path.removeprefix("file://"), alias or Path(path).name))
        args += [option] if value is None else [option, value]
    args += argv[position:]  # the application and its own arguments, untouched
    if deploy_mode != "cluster":
        return ["--deploy-mode", deploy_mode, *args], {}, []
    return ["--deploy-mode", "client", *args], env, archives


def main(argv: list[str]) -> int:
    client_args, driver_env, archives = plan(argv)
    spark_submit = Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit"
    if archives:
        driver_dir = Path(tempfile.mkdtemp(prefix="driver-", dir=os.getcwd()))
        for path, alias in archives:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(driver_dir / alias)
        os.chdir(driver_dir)
        print(
            f"rehearsal: YARN cluster mode -> client mode in {driver_dir} "
            f"(archives {[a for _, a in archives]}, driver env {sorted(driver_env)})",
            file=sys.stderr,
        )
    os.execve(str(spark_submit), [str(spark_submit), *client_args], {**os.environ, **driver_env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
