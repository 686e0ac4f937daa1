"""Ports of a test's private stack: none may overlap, or a server of the stack fails to bind."""

from __future__ import annotations

import support


def test_the_broker_and_mariadb_never_get_a_port_of_seaweedfs_block(monkeypatch):
    monkeypatch.setattr(support, "free_port_base", lambda span: 41000)
    # The kernel hands out 41005 (SeaweedFS's block 41000-41006), then a gRPC port, then 41020 twice.
    monkeypatch.setattr(support, "kernel_free_port", iter([41005, 51003, 41020, 41020, 41021]).__next__)
    assert support.stack_ports() == (41020, 41021, 41000)
