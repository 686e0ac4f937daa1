"""Every metric an alarm or the dashboard of the synthesized templates reads in the jobs' namespace,
and whether something publishes it: a job (what reached the rehearsal's CloudWatch stand-in) or a
metric filter of the templates. CloudWatch identifies a metric by its name and its exact set of
dimensions (an alarm on {Job} sees nothing a job sends with {Job, Table}), so a renamed dimension value
in a job silences an alarm without any error; this is where that shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

Metric = tuple[str, frozenset[tuple[str, str]]]  # (name, {(dimension, value)})


def _render(value) -> str:
    """A template value as text; references become a placeholder (none is a dimension of ours)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_render(part) for part in parts)
    return "<reference>"


def watched(templates: dict[str, dict], namespace: str) -> Iterator[tuple[str, Metric]]:
    """(where, metric) for every alarm metric and dashboard metric in `namespace`; a dashboard SEARCH
    yields its MetricName with the dimension values it names."""
    for template in templates.values():
        for logical_id, resource in template.get("Resources", {}).items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::CloudWatch::Alarm":
                stats = [props] if "MetricName" in props else [
                    q["MetricStat"]["Metric"] for q in props.get("Metrics", []) if "MetricStat" in q
                ]  # fmt: skip
                for stat in stats:
                    if stat.get("Namespace") == namespace:
                        dims = frozenset((d["Name"], _render(d["Value"])) for d in stat.get("Dimensions", []))
                        yield f"alarm {logical_id}", (stat["MetricName"], dims)
            elif resource["Type"] == "AWS::CloudWatch::Dashboard":
                body = json.loads(_render(props["DashboardBody"]))
                for widget in body.get("widgets", []):
                    title = widget.get("properties", {}).get("title", "?")
                    for line in widget.get("properties", {}).get("metrics", []) or []:
                        yield from _dashboard_line(f"dashboard widget {title!r}", line, namespace)


def _dashboard_line(where: str, line: list, namespace: str) -> Iterator[tuple[str, Metric]]:
    if line and isinstance(line[0], dict) and "expression" in line[0]:
        search = re.match(r"SEARCH\('\{([^,}]+)[^}]*\}\s*(.*?)',", line[0]["expression"])
        if search and search.group(1) == namespace:
            terms = dict(re.findall(r'(\w+)="([^"]*)"', search.group(2)))
            name = terms.pop("MetricName")
            yield where, (name, frozenset(terms.items()) | {("*", "*")})  # any further dimensions
        return
    fields = [f for f in line if not isinstance(f, dict)]
    if fields and fields[0] == namespace:
        yield where, (fields[1], frozenset(zip(fields[2::2], fields[3::2], strict=True)))


def filtered(templates: dict[str, dict], namespace: str) -> set[Metric]:
    """Metrics the templates' own metric filters publish (from log lines, not from a job)."""
    found = set()
    for template in templates.values():
        for resource in template.get("Resources", {}).values():
            if resource["Type"] == "AWS::Logs::MetricFilter":
                for transform in resource["Properties"]["MetricTransformations"]:
                    if transform["MetricNamespace"] == namespace:
                        dims = frozenset((d["Key"], d["Value"]) for d in transform.get("Dimensions", []))
                        found.add((transform["MetricName"], dims))
    return found


def published(list_metrics: Iterable[dict]) -> set[Metric]:
    """CloudWatch ListMetrics entries as metrics."""
    return {
        (m["MetricName"], frozenset((d["Name"], d["Value"]) for d in m.get("Dimensions", [])))
        for m in list_metrics
    }


def unpublished(templates: dict[str, dict], namespace: str, list_metrics: Iterable[dict]) -> list[str]:
    """What an alarm or the dashboard watches that nothing published, one line each."""
    sent = published(list_metrics) | filtered(templates, namespace)
    problems = []
    for where, (name, dims) in watched(templates, namespace):
        if ("*", "*") in dims:  # a SEARCH: the named dimension values, others free
            named = dims - {("*", "*")}
            ok = any(n == name and named <= d for n, d in sent)
        else:
            ok = (name, dims) in sent
        if not ok:
            problems.append(
                f"{where} watches {namespace} {name} {dict(sorted(dims - {('*', '*')}))}, which no job "
                "published in the rehearsal and no metric filter makes"
            )
    return sorted(set(problems))
