"""librdkafka client settings for a `KafkaConfig`: plaintext locally, TLS + IAM on MSK."""

from __future__ import annotations

from jobs.config import KafkaConfig


def msk_iam_token_callback(region: str):
    """The `oauth_cb` confluent-kafka calls for an MSK IAM (OAUTHBEARER) token."""

    def token(_oauth_config: str) -> tuple[str, float]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        auth_token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
        return auth_token, expiry_ms / 1000

    return token


def kafka_client_config(kafka: KafkaConfig) -> dict[str, object]:
    """Connection properties for a producer or consumer (add role-specific ones on top)."""
    props = dict(kafka.client_properties())
    if kafka.auth == "iam":
        if not kafka.region:
            raise ValueError("MSK IAM auth needs the AWS region (--region)")
        props["oauth_cb"] = msk_iam_token_callback(kafka.region)
    return props
