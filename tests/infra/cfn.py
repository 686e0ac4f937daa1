"""Small readers of CloudFormation template values, shared by the infra tests and their fixtures."""

from __future__ import annotations


def as_list(value) -> list:
    """A policy's Action/Resource (a string or a list) as a list."""
    return value if isinstance(value, list) else [value]
