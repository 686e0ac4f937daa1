"""An EMR node on this machine: its file system root, Spark install, rendered configuration and
bootstrap actions, all taken from the synthesized `AWS::EMR::Cluster`.

EMR renders the cluster's classifications into `/etc/spark/conf` (`spark-defaults.conf`,
`spark-env.sh`), adds its own settings (`spark.master yarn`, the Iceberg jar when
`iceberg-defaults` enables it) and runs the bootstrap actions before it installs the applications.
The rehearsal does the same under a temporary root, with values substituted (`substitutions.py`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from lakehouse.rehearsal.assembly import CloudAssembly, Resolver, require_resolved
from lakehouse.rehearsal.local_s3 import LocalS3
from lakehouse.rehearsal.substitutions import JDBC_CATALOG, Substitutions

SPARK_HOME = "/usr/lib/spark"
SPARK_CONF_DIR = "/etc/spark/conf"
ICEBERG_LIB = "/usr/share/aws/iceberg/lib"  # where EMR puts the Iceberg runtime when enabled
TRINO_CONF = "/etc/trino/conf"
TRINO_INSTALL = "/usr/lib/trino"


class NodeError(RuntimeError):
    """The node could not be prepared as EMR would; the message says which step and why."""


@dataclass(frozen=True)
class EmrNode:
    root: Path
    spark_defaults: dict[str, str]
    spark_env: dict[str, str]
    bin_dir: Path  # stand-ins for node commands (yarn, spark-submit, systemctl) go first on PATH

    @property
    def spark_home(self) -> Path:
        return self.root / SPARK_HOME.lstrip("/")

    @property
    def conf_dir(self) -> Path:
        return self.root / SPARK_CONF_DIR.lstrip("/")


def cluster_configurations(assembly: CloudAssembly, resolver: Resolver) -> list[dict]:
    cluster = assembly.only("AWS::EMR::Cluster")
    configurations = resolver.resolve(cluster.stack, cluster.properties.get("Configurations", []))
    require_resolved("the cluster's Configurations", configurations)
    return configurations


def classification(configurations: list[dict], name: str) -> dict | None:
    for config in configurations:
        if config["Classification"] == name:
            return config
    return None


def render_spark_defaults(
    configurations: list[dict], subs: Substitutions, *, iceberg_classpath: str, catalog_jdbc_uri: str
) -> dict[str, str]:
    """spark-defaults as EMR writes it: the classification's properties (values localized), plus
    what EMR itself adds: the master and, with `iceberg.enabled`, the Iceberg runtime on the class
    path. A catalog whose implementation became the JDBC catalog gets the keys that catalog needs."""
    spark = classification(configurations, "spark-defaults") or {}
    defaults = {
        key: subs.localize(str(value)) for key, value in spark.get("ConfigurationProperties", {}).items()
    }
    defaults["spark.master"] = subs.record(
        "spark.master (EMR adds it)", "yarn", subs.local.spark_master,
        "YARN: containers, queues, the application master, `yarn application -kill`",
    )  # fmt: skip
    iceberg = classification(configurations, "iceberg-defaults") or {}
    if iceberg.get("ConfigurationProperties", {}).get("iceberg.enabled") == "true":
        subs.record(
            "Iceberg runtime on the class path (iceberg.enabled)",
            "/usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar (1.10.1-amzn)", iceberg_classpath,
            "EMR's Iceberg build (1.10.1-amzn) and its bundled AWS SDK; the rehearsal runs OSS 1.10.2",
        )  # fmt: skip
        for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
            defaults[key] = ":".join(p for p in (defaults.get(key), iceberg_classpath) if p)
    for key, value in list(defaults.items()):
        if key.endswith(".catalog-impl") and value == JDBC_CATALOG:
            catalog = key.removesuffix(".catalog-impl")
            added = {
                f"{catalog}.uri": catalog_jdbc_uri,
                # The schema is made by the rehearsal (lakehouse/local/catalog.py explains why).
                f"{catalog}.jdbc.init-catalog-tables": "false",
                f"{catalog}.jdbc.busy_timeout": "60000",
            }
            for added_key, added_value in added.items():
                subs.record(f"{added_key} (added: the JDBC catalog needs it)", "-", added_value, "-")
            defaults.update(added)
    return defaults


def render_spark_env(configurations: list[dict], subs: Substitutions) -> dict[str, str]:
    spark_env = classification(configurations, "spark-env") or {}
    exports: dict[str, str] = {}
    for nested in spark_env.get("Configurations", []):
        if nested["Classification"] == "export":
            for key, value in nested.get("ConfigurationProperties", {}).items():
                exports[key] = subs.node_path(value) if str(value).startswith("/usr/") else str(value)
    return exports


def write_spark_conf(conf_dir: Path, defaults: dict[str, str], exports: dict[str, str]) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "# rendered by the rehearsal from the cluster's spark-defaults classification\n"
        + "".join(f"{key} {value}\n" for key, value in sorted(defaults.items()))
    )
    (conf_dir / "spark-env.sh").write_text(
        "# rendered by the rehearsal from the cluster's spark-env classification\n"
        + "".join(f"export {key}={value}\n" for key, value in sorted(exports.items()))
    )


# ---- the node's file system -----------------------------------------------------------------------


def install_python(root: Path, job_python: str = "/usr/bin/python3.11") -> Path:
    """A clean CPython 3.11 at `<root>/usr/bin/python3.11`: a venv without pip and without the
    base interpreter's site-packages, so nothing of this project is importable but what a step
    brings in its archive."""
    prefix = root / Path(job_python).parent.parent.relative_to("/")
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(prefix)
    return root / job_python.lstrip("/")


def install_spark(root: Path) -> Path:
    """Spark where EMR has it (`/usr/lib/spark`): this machine's Spark 3.5 distribution (the pip
    package carries it: bin, sbin, jars and python/lib/{pyspark,py4j}.zip). Scripts and Python zips
    are copied; the jars are linked (read only)."""
    import pyspark

    source = Path(pyspark.__file__).parent
    home = root / SPARK_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    for name in ("bin", "sbin"):
        shutil.copytree(source / name, home / name, dirs_exist_ok=True)
    shutil.copytree(source / "python" / "lib", home / "python" / "lib", dirs_exist_ok=True)
    if not (home / "jars").exists():
        (home / "jars").symlink_to(source / "jars", target_is_directory=True)
    return home


def install_iceberg_jars(root: Path, jars: tuple[str, ...]) -> str:
    """The Iceberg runtime (+ relocated Jackson, + SQLite JDBC for the catalog stand-in) in EMR's
    Iceberg lib folder; returns the class path entry."""
    lib = root / ICEBERG_LIB.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    for jar in jars:
        target = lib / Path(jar).name
        if not target.exists():
            target.symlink_to(jar)
    return f"{lib}/*"


def install_trino(root: Path) -> None:
    """What the configure-catalogs waiter waits for (EMR installs Trino after the bootstrap)."""
    (root / TRINO_CONF.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / TRINO_INSTALL.lstrip("/")).mkdir(parents=True, exist_ok=True)


def write_command(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


# ---- bootstrap actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapRun:
    name: str
    script: Path
    args: list[str]
    seconds: float
    output: str


def run_bootstrap_actions(
    assembly: CloudAssembly, resolver: Resolver, subs: Substitutions, s3: LocalS3, node: EmrNode, log
) -> list[BootstrapRun]:
    """Each bootstrap action's script, from what the deployment uploaded, with its template
    arguments plus `--root` (the node's root), as the node's user would run it."""
    cluster = assembly.only("AWS::EMR::Cluster")
    actions = resolver.resolve(cluster.stack, cluster.properties.get("BootstrapActions", []))
    require_resolved("the cluster's BootstrapActions", actions)
    runs = []
    for action in actions:
        script_action = action["ScriptBootstrapAction"]
        script = s3.path_of(script_action["Path"])
        if not script.exists():
            raise NodeError(
                f"bootstrap action {action['Name']}: {script_action['Path']} was never uploaded by the "
                "deployment (no BucketDeployment puts it there)"
            )
        # Paths in the arguments stay node paths: `--root` puts them under the node's root.
        args = [str(a) for a in script_action.get("Args", [])]
        command = ["bash", str(script), *args, "--root", str(node.root)]
        subs.record("bootstrap action root", "/", str(node.root), "root-only effects (sudo, systemctl)")
        began = time.monotonic()
        result = subprocess.run(
            command, capture_output=True, text=True, env=node_environment(node), timeout=120
        )
        run = BootstrapRun(
            action["Name"], script, args, time.monotonic() - began, result.stderr + result.stdout
        )
        log(f"bootstrap {action['Name']}: {' '.join(args)} -> exit {result.returncode} ({run.seconds:.1f}s)")
        if result.returncode != 0:
            raise NodeError(f"bootstrap action {action['Name']} exited {result.returncode}:\n{run.output}")
        runs.append(run)
    return runs


def node_environment(node: EmrNode, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a step or bootstrap action sees on the node: no project venv, no checkout
    on any path; the node's stand-in commands first on PATH."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin and "/.venv/" not in p
    ]
    keep = ("HOME", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "TZ")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.update(
        {
            "PATH": os.pathsep.join([str(node.bin_dir), str(node.spark_home / "bin"), *path]),
            "SPARK_HOME": str(node.spark_home),
            "SPARK_CONF_DIR": str(node.conf_dir),
        }
    )
    env.update(extra or {})
    return env


def wait_for_file(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.2)
    return path.exists()
