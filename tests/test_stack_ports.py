"""Ports of a stack of its own (tests, benches, the rehearsal): none may overlap, or a server of the
stack fails to bind."""

from __future__ import annotations

import pytest

from lakehouse.local import settings
from lakehouse.local.settings import StackSettings, object_store_ports


def test_mariadb_and_the_broker_never_get_a_port_of_seaweedfs_block(monkeypatch, tmp_path):
    monkeypatch.setattr(settings, "port_bindable", lambda port: True)
    # SeaweedFS's block at 15000 (15000-15006, gRPC 25000-25006) is picked first; then a port inside
    # it, gRPC's base (the S3 gateway's), 15020 for MariaDB, 15020 again, the default stack's broker
    # port and 15021.
    picks = iter([15000, 15005, 25000, 15020, 15020, 19092, 15021])
    monkeypatch.setattr("random.choice", lambda candidates: next(picks))
    chosen = StackSettings.on_free_ports(tmp_path)
    assert (chosen.mysql_port, chosen.kafka_port, chosen.s3_port) == (15020, 15021, 15000)


def test_ports_held_by_a_server_are_not_picked(monkeypatch, tmp_path):
    held = {*object_store_ports(15000), 15020}
    monkeypatch.setattr(settings, "port_bindable", lambda port: port not in held)
    # 18330's block would hold the default stack's SeaweedFS ports (18333-18339).
    picks = iter([15000, 18330, 16000, 15020, 15021, 15022])
    monkeypatch.setattr("random.choice", lambda candidates: next(picks))
    chosen = StackSettings.on_free_ports(tmp_path)
    assert (chosen.mysql_port, chosen.kafka_port, chosen.s3_port) == (15021, 15022, 16000)


def test_seaweedfs_block_is_every_port_weed_mini_binds():
    # Seen on a running stack at 16740: 16740-16746 and gRPC 26740-26744.
    assert {*range(16740, 16747), *range(26740, 26745)} <= set(object_store_ports(16740))


def test_picked_ports_are_outside_the_kernels_ephemeral_range_and_point_subprocesses_at_the_stack(tmp_path):
    chosen = StackSettings.on_free_ports(tmp_path)
    ports = [chosen.mysql_port, chosen.kafka_port, *object_store_ports(chosen.s3_port)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < 32768
    env = chosen.environment()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert StackSettings.resolve(env["LAKEHOUSE_HOME"]) == chosen
