"""``PerfOptions.shared_cores``: slots of a one-machine cluster share its CPU cores, so the
simulator slows every running job when more devices are busy than there are cores."""

import pytest

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.model.families import ModelProfile
from phalanx.cluster.model.perf import PerfModel, PerfOptions
from phalanx.cluster.policies import FIFO, FirstFit
from phalanx.cluster.sim.event import Simulator
from phalanx.errors import ConfigError


def _jcts(cores: int) -> dict[str, float]:
    perf = PerfModel({"m": ModelProfile("m", 0.0, 0.0, (), 0.0, "test")},
                     options=PerfOptions(interference=False, cpu=False, shared_cores=cores))
    # a: 10 s alone on 1 device from t=0; b: 2 devices, 10 s alone, from t=2
    jobs = [JobSpec(0, "a", 0.0, 1, 10.0, 10.0, "m", cpu_per_gpu=1),
            JobSpec(1, "b", 2.0, 2, 10.0, 10.0, "m", cpu_per_gpu=1)]
    res = Simulator(uniform(servers=3, devices=1, switches=1), jobs, FIFO(), FirstFit(), perf).run()
    return {st.spec.name: st.end - st.spec.submit for st in res.jobs}


def test_shared_cores_slow_every_job_while_devices_outnumber_cores():
    assert _jcts(0) == {"a": pytest.approx(10.0), "b": pytest.approx(10.0)}
    # 2 cores: alone a runs at full speed for 2 s; then 3 busy devices run at 2/3 speed:
    # a needs 8 s more -> 12 s at 2/3; b does 8 of 10 in those 12 s, then 2 s alone
    got = _jcts(2)
    assert got["a"] == pytest.approx(14.0)
    assert got["b"] == pytest.approx(12.0 + 2.0)
    with pytest.raises(ConfigError):
        PerfOptions(shared_cores=-1)
