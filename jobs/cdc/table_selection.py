"""Which source tables CDC syncs, and the Iceberg table each goes to.

Patterns (`--include`, `--exclude`) are shell globs on `schema.table` (`user_db.*`, `user_db.order_*`),
matched with the source's letter case. A table a pattern selects goes to `<namespace>.<table>` in
lower case (the Glue catalog keeps names in lower case). `--table SOURCE=NAMESPACE.TABLE` names a
table and its target explicitly; `--exclude` does not apply to it. Without `--table` or
`--include`, the selection is every table of the source database (`user_db.*` -> `dim_db.<table>`).

The selection is a rule, not a list: a table created in the source while CDC runs is synced when
the rule selects it (`sync.py`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from jobs.config import SOURCE_DATABASE, ConfigError, LakehouseConfig

DEFAULT_NAMESPACE = "dim_db"
# A snapshot's staging table is `<target>__cdc_snapshot_<id>` (snapshot.py) until it is renamed.
STAGING_SUFFIX = "__cdc_snapshot"
# Never synced, whatever a pattern says: the server's own schemas and CDC's barrier table.
RESERVED_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys", "lakehouse_meta"})
# A name Spark SQL and the Glue catalog take unquoted (the jobs' SQL does not quote table names).
_PLAIN_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class TableSpec:
    source_schema: str
    source_name: str
    target: str  # fully qualified: lakehouse.dim_db.products

    @property
    def source(self) -> str:
        return f"{self.source_schema}.{self.source_name}"

    @property
    def source_key(self) -> tuple[str, str]:
        return (self.source_schema, self.source_name)

    @classmethod
    def parse(cls, text: str, config: LakehouseConfig) -> TableSpec:
        """`[schema.]table=namespace.table`, e.g. `user_db.products=dim_db.products`."""
        source, sep, target = text.partition("=")
        if not sep or "." not in target:
            raise ConfigError(
                f"--table {text!r}: use SOURCE=NAMESPACE.TABLE, e.g. user_db.products=dim_db.products"
            )
        schema, _, name = source.rpartition(".")
        namespace, _, table = target.rpartition(".")
        return cls(schema or SOURCE_DATABASE, name, config.table(namespace.split(".")[-1], table))

    def matches(self, name: str) -> bool:
        short_target = ".".join(self.target.split(".")[-2:])
        return name in (self.source, self.source_name, self.target, short_target)


class UnusableName(ValueError):
    """A selected source table whose name cannot be an Iceberg table name as it is."""


@dataclass(frozen=True)
class TableSelection:
    config: LakehouseConfig
    explicit: tuple[TableSpec, ...] = ()
    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    namespace: str = DEFAULT_NAMESPACE

    @classmethod
    def from_args(
        cls,
        config: LakehouseConfig,
        tables: Sequence[str] = (),
        includes: Sequence[str] = (),
        excludes: Sequence[str] = (),
        namespace: str = DEFAULT_NAMESPACE,
    ) -> TableSelection:
        for pattern in (*includes, *excludes):
            if "." not in pattern:
                raise ConfigError(f"pattern {pattern!r}: use a SCHEMA.TABLE glob, e.g. user_db.*")
        if not tables and not includes:
            includes = (f"{SOURCE_DATABASE}.*",)
        explicit = tuple(TableSpec.parse(t, config) for t in tables)
        return cls(config, explicit, tuple(includes), tuple(excludes), namespace)

    @classmethod
    def of(cls, config: LakehouseConfig, specs: Sequence[TableSpec]) -> TableSelection:
        """Exactly these tables (no pattern)."""
        return cls(config, tuple(specs))

    @property
    def dynamic(self) -> bool:
        """Tables the job does not know yet may join (a pattern selects them)."""
        return bool(self.includes)

    @property
    def schemas(self) -> tuple[str, ...] | None:
        """The source schemas to list tables in; None: any (a pattern's schema part is a glob)."""
        names = {s.source_schema for s in self.explicit}
        for pattern in self.includes:
            schema = pattern.rsplit(".", 1)[0]
            if any(ch in schema for ch in "*?["):
                return None
            names.add(schema)
        return tuple(sorted(names))

    def may_target(self, lake_name: str) -> bool:
        """Whether a pattern could map some source table to `<namespace>.<lake_name>` (a cheap filter
        before reading the lake table's properties; `spec_for` decides)."""
        return any(fnmatchcase(lake_name, p.rsplit(".", 1)[-1].lower()) for p in self.includes)

    def spec_for(self, schema: str, name: str) -> TableSpec | None:
        """The spec of `schema.name` if the selection takes it; raises UnusableName for a selected
        table whose name needs changing before it can be synced under a pattern."""
        for spec in self.explicit:
            if spec.source_key == (schema, name):
                return spec
        if schema in RESERVED_SCHEMAS:
            return None
        qualified = f"{schema}.{name}"
        if not any(fnmatchcase(qualified, p) for p in self.includes):
            return None
        if any(fnmatchcase(qualified, p) for p in self.excludes):
            return None
        target = name.lower()
        if not _PLAIN_NAME.match(target):
            raise UnusableName(
                f"{qualified}: its name is not a plain Iceberg table name (letters, digits, _); "
                f"sync it as --table {qualified}={self.namespace}.<name>, or --exclude it"
            )
        return TableSpec(schema, name, self.config.table(self.namespace, target))

    def selects(self, schema: str, name: str) -> bool:
        try:
            return self.spec_for(schema, name) is not None
        except UnusableName:
            return True  # selected; the sync reports the name

    def covers(self, name: str) -> bool:
        """Whether a `--resync` name (`schema.table`, `table`, `namespace.table`) can be selected."""
        if any(spec.matches(name) for spec in self.explicit):
            return True
        schema, _, table = name.rpartition(".")
        if schema == self.namespace:
            return bool(self.includes)  # a target name; its source is known once listed
        return self.selects(schema or SOURCE_DATABASE, table)

    def describe(self) -> str:
        parts = [s.source for s in self.explicit] + list(self.includes)
        text = ", ".join(parts)
        return text + (f" (except {', '.join(self.excludes)})" if self.excludes else "")
