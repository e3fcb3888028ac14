"""Shared fixtures of the cluster tests: the data folder (../shared/data from the repo root)
and small inputs."""

from pathlib import Path

import pytest

from phalanx.cluster.model.families import load_profiles
from phalanx.cluster.model.perf import PerfModel
from phalanx.cluster.model.profiles import load_pollux_apps

REPO = Path(__file__).resolve().parents[2]
DATA = (REPO / ".." / "shared" / "data").resolve()
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def perf() -> PerfModel:
    return PerfModel(load_profiles(DATA), load_pollux_apps(DATA))
