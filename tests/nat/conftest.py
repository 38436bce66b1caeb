"""The NAT tests share one network per module; they need root and are skipped without it."""

from __future__ import annotations

import pytest

from tests.nat.network import nat_network
from tests.nat.topology import missing_requirements

_missing = missing_requirements()


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    if _missing:
        pytest.skip(f"NAT tests: {_missing}")
    with nat_network(tmp_path_factory.mktemp("nat")) as net:
        yield net
