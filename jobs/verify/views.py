"""clicks -> product_views: the view equals the GROUP BY of the click table up to its watermark.

The view's rows and its watermark (`lakehouse.views.click-offsets`) are read from one snapshot of
the view; the clicks it has counted are the click rows below that watermark, whatever the views
job does meanwhile (later clicks are above it). Compared per group (productId, name,
product_price; NULL keys equal).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.verify.findings import EXAMPLES, CheckResult, Finding
from jobs.views.job import GROUP_COLUMNS, Watermark

VIEWS_HINT = (
    "the view differs from the clicks it has counted: rebuild it (drop `ads_behavior.product_views` and "
    "run `lakehouse run views --until-idle`; it counts every click again). If the kafka -> clicks check "
    "failed too, repair the click table first"
)


def counted_clicks(clicks: DataFrame, watermark: Watermark) -> DataFrame:
    """Click rows below the watermark: what the view has counted."""
    condition = F.lit(False)
    for partition, end in watermark.items():
        condition = condition | ((F.col("kafka_partition") == partition) & (F.col("kafka_offset") < end))
    return clicks.where(condition)


def expected_views(clicks: DataFrame, watermark: Watermark) -> DataFrame:
    """The source system's statistic over the counted clicks: count(uid) per group."""
    return counted_clicks(clicks, watermark).groupBy(*GROUP_COLUMNS).agg(F.count("uid").alias("views"))


def view_differences(expected: DataFrame, actual: DataFrame) -> DataFrame:
    """Groups whose count differs (or that only one side has): group columns, expected, actual."""
    e, a = expected.alias("e"), actual.groupBy(*GROUP_COLUMNS).agg(F.sum("views").alias("views")).alias("a")
    on = [F.col(f"e.{c}").eqNullSafe(F.col(f"a.{c}")) for c in GROUP_COLUMNS]
    joined = e.join(a, on, "full_outer").select(
        *(F.coalesce(F.col(f"e.{c}"), F.col(f"a.{c}")).alias(c) for c in GROUP_COLUMNS),
        F.coalesce(F.col("e.views"), F.lit(0)).alias("expected"),
        F.coalesce(F.col("a.views"), F.lit(0)).alias("actual"),
    )
    return joined.where(F.col("expected") != F.col("actual"))


def check_views(clicks: DataFrame, views: DataFrame, watermark: Watermark, table: str) -> CheckResult:
    result = CheckResult("clicks -> views", table)
    expected = expected_views(clicks, watermark).cache()
    try:
        result.compared = expected.count()
        differing = view_differences(expected, views).orderBy(*GROUP_COLUMNS).collect()
    finally:
        expected.unpersist()
    if differing:
        examples = tuple(
            f"{r['productId']}/{r['name']}/{r['product_price']}: {r['actual']} counted of {r['expected']}"
            for r in differing[:EXAMPLES]
        )
        result.findings.append(
            Finding("groups with a wrong count", len(differing), examples, VIEWS_HINT, row_values=True)
        )
    if not watermark:
        result.notes.append("the view has counted nothing yet")
    return result
