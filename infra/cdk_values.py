"""The CDK types of the config's plain values (`infra/config.py` imports no aws_cdk, so that
`lakehouse aws ...` never starts Node); the stacks and constructs convert where they use them."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs

from infra.config import Removal

_REMOVAL_POLICIES = {
    Removal.DESTROY: RemovalPolicy.DESTROY,
    Removal.RETAIN: RemovalPolicy.RETAIN,
    Removal.SNAPSHOT: RemovalPolicy.SNAPSHOT,
}
# The retention periods CloudWatch Logs accepts, in days.
_LOG_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
}


def removal_policy(removal: Removal) -> RemovalPolicy:
    return _REMOVAL_POLICIES[removal]


def log_retention(days: int) -> logs.RetentionDays:
    """CDK's retention for `days`, which must be one CloudWatch Logs accepts."""
    try:
        return _LOG_RETENTION[days]
    except KeyError:
        raise ValueError(
            f"log retention of {days} days: CloudWatch Logs accepts {', '.join(map(str, _LOG_RETENTION))}"
        ) from None
