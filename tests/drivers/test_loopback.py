"""A port picked for a server to bind later lies outside the ephemeral range that every
outgoing connection draws from (the kernel's bind(0) would hand out one inside it)."""

from __future__ import annotations

from pathlib import Path

from drivers.loopback import free_port


def test_a_picked_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), ports
    assert len(ports) > 1, "picked at random, so runs sharing a machine rarely meet"

