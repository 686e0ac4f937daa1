"""Is a stored binlog position still readable on the source? Purged, or past the source's end."""

from __future__ import annotations

from jobs.cdc.binlog_reader import BinlogPosition


def _sequence_per_domain(gtid_state: str) -> dict[str, int]:
    """MariaDB GTID state `0-1-42,1-2-7` -> {domain: sequence number}."""
    out = {}
    for gtid in filter(None, (g.strip() for g in gtid_state.split(","))):
        domain, _server, seq = gtid.split("-")
        out[domain] = int(seq)
    return out


def position_problem(
    position: BinlogPosition, logs: dict[str, int], mariadb_gtid_state: str | None
) -> str | None:
    """Why the source cannot continue from `position` (None: it can).

    `logs` is SHOW BINARY LOGS (file -> size); `mariadb_gtid_state` the server's @@gtid_binlog_pos
    (None on MySQL). A position past the end means the source lost binlog the lake already applied
    (a crash without sync_binlog=1, a restore from backup, a failover to a lagging replica).
    """
    lost = "past the end of the source's binlog ({}): the source lost changes the lake already has"
    if position.file not in logs:
        if logs and position.file > max(logs):
            return lost.format(f"newest file {max(logs)}")
        return "no longer on the server (binlog purged)"
    if position.pos > logs[position.file]:
        return lost.format(f"{position.file} has {logs[position.file]} bytes")
    if mariadb_gtid_state is not None and ":" not in position.gtid:
        server = _sequence_per_domain(mariadb_gtid_state)
        for domain, seq in _sequence_per_domain(position.gtid).items():
            if seq > server.get(domain, 0):
                return lost.format(f"GTID {position.gtid} is ahead of the server's {mariadb_gtid_state}")
    return None
