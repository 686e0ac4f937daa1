"""Builds the CDK app of one environment: context -> typed config -> stacks -> cdk-nag."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from aws_cdk import App

from infra import emr_package
from infra.config import DEV_LAKE_READERS_CONTEXT_KEY, AccessSettings, DeploymentConfig, az_context_key
from infra.nag import add_nag_checks
from infra.stacks import LakehouseStacks
from jobs.config import ConfigError

DEFAULT_ENV = "dev"


def config_from_context(app: App, environ: Mapping[str, str] = os.environ) -> DeploymentConfig:
    """The only place context is read: `-c env=dev|prod` (default dev), optional `-c azs=a,b`, the
    AZs `lakehouse aws preflight --pin-azs` pinned in cdk.context.json, `-c parked=true` (dev; set
    by `lakehouse aws park`), `-c alert_email=you@example.com` (subscribes it to the alerts), and
    `-c lake_readers=<role arn>,…` / `-c security_admins=<role arn>,…` (infra/access.py); in dev also
    the lake readers the preflight pinned (`lakehouse:dev-lake-readers`, the person who deployed);
    `-c verify_repair=true` (the scheduled verify step repairs the clicks and dimensions it finds wrong).


    Account and region come from the CLI's environment (CDK_DEFAULT_ACCOUNT/REGION) when both are
    present; otherwise the stacks stay environment-agnostic and synth needs no credentials.
    """
    env_name = app.node.try_get_context("env") or DEFAULT_ENV
    account, region = environ.get("CDK_DEFAULT_ACCOUNT"), environ.get("CDK_DEFAULT_REGION")
    azs_context = app.node.try_get_context("azs")
    azs = tuple(a.strip() for a in str(azs_context).split(",") if a.strip()) if azs_context else None
    if not azs and account and region:
        # Pinned in cdk.context.json by `lakehouse aws preflight --pin-azs` (chosen by zone ID).
        pinned = app.node.try_get_context(az_context_key(account, region))
        azs = tuple(pinned) if pinned else None
    parked = str(app.node.try_get_context("parked") or "false").lower()
    if parked not in ("true", "false"):
        raise ConfigError(f"-c parked={parked}: expected true or false")
    verify_repair = str(app.node.try_get_context("verify_repair") or "false").lower()
    if verify_repair not in ("true", "false"):
        raise ConfigError(f"-c verify_repair={verify_repair}: expected true or false")
    alert_email = app.node.try_get_context("alert_email")
    lake_readers = app.node.try_get_context("lake_readers")
    if env_name == "dev":
        # The preflight pinned whoever ran it (cdk.context.json): Athena reads as the caller and the
        # warehouse bucket lets only named roles read, so without this the deployer's own query fails.
        pinned = app.node.try_get_context(DEV_LAKE_READERS_CONTEXT_KEY) or []
        given = lake_readers if isinstance(lake_readers, list | tuple) else str(lake_readers or "").split(",")
        lake_readers = [*(r for r in given if str(r).strip()), *pinned] or None
    return DeploymentConfig.for_env(
        str(env_name),
        account=account,
        region=region,
        availability_zones=azs,
        parked=parked == "true",
        alert_email=str(alert_email) if alert_email else None,
        access=AccessSettings.from_context(lake_readers, app.node.try_get_context("security_admins")),
        verify_repair=verify_repair == "true",
    )


def build_lakehouse(app: App, config: DeploymentConfig, *, nag: bool = True) -> LakehouseStacks:
    if config.account and config.region and config.availability_zones:
        # Note: seed CDK's AZ lookup with the configured AZs, so an account/region-bound synth
        # makes no lookup (and needs no credentials beyond the CLI's own).
        app.node.set_context(
            f"availability-zones:account={config.account}:region={config.region}",
            list(config.availability_zones),
        )
    # The jobs' artifact set (`make package`); built here when missing, reused when up to date.
    compute = config.compute
    package = emr_package.build(
        architectures=emr_package.architectures_for(
            (*compute.primary_instance_types, *compute.worker_instance_types)
        ),
        log=lambda message: print(message, file=sys.stderr),
    )
    stacks = LakehouseStacks(app, config, job_package=package)
    if nag:
        add_nag_checks(app)
    return stacks
