"""The Glue databases of the templates, as namespaces of the local catalog stand-in."""

from __future__ import annotations

from lakehouse.rehearsal.assembly import CloudAssembly, Resolver, require_resolved
from lakehouse.rehearsal.substitutions import Substitutions


def glue_namespaces(assembly: CloudAssembly, resolver: Resolver, subs: Substitutions) -> dict[str, str]:
    """name -> location (localized) of every AWS::Glue::Database. Jobs never create namespaces:
    on AWS the Lake stack does, so the rehearsal's catalog holds exactly these."""
    namespaces = {}
    for database in assembly.resources("AWS::Glue::Database"):
        database_input = resolver.resolve(database.stack, database.properties["DatabaseInput"])
        require_resolved(f"Glue database {database.logical_id}", database_input)
        namespaces[database_input["Name"]] = subs.localize(database_input["LocationUri"])
    subs.record(
        "Glue databases", ", ".join(sorted(namespaces)), "namespaces of the local JDBC catalog",
        "Glue's own database API and Lake Formation",
    )  # fmt: skip
    return namespaces
