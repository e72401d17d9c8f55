"""The test suite's port picker (tests/ports.py): below the kernel's ephemeral range, where no
outgoing connection can take a port between the pick and the node's bind, and never twice."""

from __future__ import annotations

import socket

from tests import ports


def test_ports_are_free_distinct_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    low = ports._ephemeral_low()
    first = ports.free_ports(12)
    second = ports.free_ports(12)
    assert len(set(first)) == 12 and not set(first) & set(second)
    if low - ports.PORTS_LOW >= 1024:
        assert all(ports.PORTS_LOW <= p < low for p in first + second)
    for port in first:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free
