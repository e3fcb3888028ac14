"""memlimit.explain: which failures of a rank under --memory-limit become the one line
naming the limit, and which stay themselves (no limit applied, or not an allocation)."""

import pytest

from phalanx.errors import ConfigError
from phalanx.runtime import memlimit


@pytest.fixture
def applied(monkeypatch):
    monkeypatch.setattr(memlimit, "_applied", [memlimit.Budget(1000, 5000)])


@pytest.mark.parametrize("error", [
    MemoryError(),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"),
    # torch.save's zip writer when its buffer could not grow: a rank's checkpoint under the
    # limit (measured: a 4x256 GPT under sync with 160 MiB)
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 36385344 vs "
                 "36385232"),
    RuntimeError("can't start new thread"),
])
def test_an_allocation_past_the_limit_is_one_line_naming_it(applied, error):
    said = memlimit.explain(error, 3)
    assert isinstance(said, memlimit.MemoryLimitExceeded)
    assert str(said) == ("--memory-limit 1000: rank 3 ran out of its budget (1,000 bytes "
                         f"beyond the 5,000 it had mapped at start-up; RLIMIT_AS 6,000): "
                         f"{type(error).__name__}")


def test_other_failures_and_runs_without_a_limit_stay_themselves(monkeypatch, applied):
    other = RuntimeError("Connection closed by peer")
    assert memlimit.explain(other, 0) is other
    ours = ConfigError("--model: bad")
    assert memlimit.explain(ours, 0) is ours
    monkeypatch.setattr(memlimit, "_applied", [])
    oom = MemoryError()
    assert memlimit.explain(oom, 0) is oom
