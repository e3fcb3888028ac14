"""Test hosts for multi-node tests: ``network(k, rate_mbit=None)`` makes ``k`` network
namespaces on one bridge (see :mod:`phalanx.runtime.hosts`); all are torn down after the
test, even when it fails. Skips, with the reason, where namespaces cannot be created.

tests/multinode/conftest.py provides it to the tests there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from phalanx.runtime.hosts import TestNetwork, unavailable


@pytest.fixture
def network() -> Iterator[Callable[..., TestNetwork]]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no test hosts: {reason}")
    made: list[TestNetwork] = []

    def make(k: int, rate_mbit: float | None = None, tcp: str = "") -> TestNetwork:
        net = TestNetwork(k, rate_mbit, tcp=tcp)
        made.append(net)
        return net.__enter__()

    try:
        yield make
    finally:
        for net in made:
            net.teardown()
