"""The one record of a run's lost workers (runtime/exits.py, parallel/base.with_deaths): a
death only the driver saw, one only a server saw, and one both saw each land in the
summary once, with who saw it; ``workers_lost`` and ``worker_losses`` never disagree."""

from __future__ import annotations

import signal

import pytest
from torch import nn

from phalanx.parallel.base import Outcome, with_deaths
from phalanx.parallel.stats import ParameterServerStats
from phalanx.runtime.exits import DIED, STOPPED, Death, describe_exit, merge_losses, seen_by


def death(rank: int, name: str, code: int = -signal.SIGKILL, how: str = DIED) -> Death:
    return Death(rank=rank, name=name, exit_code=code, unix=1000.0 + rank, how=how)


def test_driver_only_server_only_and_both_each_once_with_their_source():
    # 1 server + 4 workers: worker w is rank 1 + w. Worker 0: both saw it; worker 2: only
    # the driver (it died after its DONE); worker 3: only the server (hung, not dead)
    servers_view = ParameterServerStats(workers_lost=[0, 3],
                                        worker_losses=merge_losses({0: 7, 3: 12}, {}))
    out = with_deaths(Outcome(nn.Linear(1, 1), 10, 5, servers_view),
                      [death(1, "worker 0"), death(3, "worker 2", -signal.SIGSEGV)],
                      first_worker=1)
    stats = out.stats
    assert stats["workers_lost"] == [0, 2, 3]
    by = {e["worker"]: e for e in stats["worker_losses"]}
    assert [e["worker"] for e in stats["worker_losses"]] == [0, 2, 3]  # once each, in order
    assert by[0] == {"worker": 0, "detected_by": ["driver", "server"], "exit_code": -9,
                     "signal": "SIGKILL", "how": DIED, "died_unix": 1001.0, "server_clock": 7}
    assert by[2] == {"worker": 2, "detected_by": ["driver"], "exit_code": -11,
                     "signal": "SIGSEGV", "how": DIED, "died_unix": 1003.0,
                     "server_clock": None}
    assert by[3] == {"worker": 3, "detected_by": ["server"], "exit_code": None,
                     "signal": None, "how": None, "died_unix": None, "server_clock": 12}
    assert out.train_samples == 10 and out.steps == 5  # the rest of the outcome kept


def test_a_death_of_a_non_worker_rank_and_an_unlost_run():
    # a server's death ends the run, so it never reaches the record; nor does rank < first
    out = with_deaths(Outcome(nn.Linear(1, 1), 1, 1, {"workers_lost": [], "worker_losses": []}),
                      [death(0, "server 0")], first_worker=1)
    assert out.stats["workers_lost"] == [] and out.stats["worker_losses"] == []
    # Sandblaster: the coordinator saw it (no clock), the driver too; first worker is rank 3
    losses = merge_losses(dict.fromkeys([1]), {}, seer="coordinator")
    out = with_deaths(Outcome(nn.Linear(1, 1), 1, 1, {"workers_lost": [1],
                                                      "worker_losses": losses}),
                      [death(4, "worker 1", 1, STOPPED)], first_worker=3, seer="coordinator")
    (entry,) = out.stats["worker_losses"]
    assert entry["detected_by"] == ["driver", "coordinator"]
    assert entry["coordinator_clock"] is None and entry["exit_code"] == 1
    assert entry["signal"] is None and entry["how"] == STOPPED


def test_seen_by_reads_back_only_what_the_seer_saw():
    losses = merge_losses({2: 5}, {1: death(2, "worker 1")})
    assert seen_by(losses) == {2: 5}
    assert seen_by(losses, "coordinator") == {}


@pytest.mark.parametrize("code, said", [(-9, "was killed by SIGKILL"), (3, "exited with code 3"),
                                        (-200, "was killed by signal 200")])
def test_exit_descriptions(code, said):
    assert describe_exit(code) == said
    event = death(1, "worker 0", code).event()
    assert event["exit_code"] == code and event["process"] == "worker 0"
    assert event["signal"] == (None if code > 0 else said.removeprefix("was killed by "))
