"""Commands that talk to the deployed (or about-to-be-deployed) AWS environment."""

from botocore.exceptions import ClientError


def error_code(error: ClientError) -> str | None:
    """The AWS error code of a failed call (`NoSuchKey`, `AccessDenied`, …), if the reply had one."""
    return error.response.get("Error", {}).get("Code")
