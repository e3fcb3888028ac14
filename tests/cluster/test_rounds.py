"""The two rounds every engine shares (``SchedulerCore.preemptive_round`` and
``elastic_round``), each returning a ``Decision`` value, and the one view of a job an
elastic policy reads, on a small cluster: what is kept, stopped, moved and placed, in which
order."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.cluster.core.allocator import Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.scheduler import SchedulerCore, placement_order
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.core.view import Choice, JobView, job_view
from phalanx.cluster.live.observe import EventTail, JobObserver
from phalanx.cluster.policies import FIFO, LeastAttainedService, Pack


def spec(i: int, gpus: int, **kw) -> JobSpec:
    return JobSpec(i, f"j{i}", float(i), gpus, 100.0, 100.0, "m", cpu_per_gpu=1, **kw)


def core_with(ordering, *specs: JobSpec, elastic=None) -> SchedulerCore:
    # 2 servers x 2 devices
    core = SchedulerCore(uniform(servers=2, devices=2, switches=1, cpu_cores=4), ordering,
                         Pack(), elastic=elastic)
    for s in specs:
        assert core.submit(s, s.submit) is not None
    return core


def start_on(core: SchedulerCore, st: JobState, devices: tuple[int, ...]) -> None:
    servers: dict[int, int] = {}
    for d in devices:
        s = core.topology.device_server[d]
        servers[s] = servers.get(s, 0) + 1
    core.allocate(st, Placement(devices, tuple(sorted(servers.items()))))
    st.running = True
    st.placements.append((0.0, devices))


def test_preemptive_round_keeps_in_order_and_pins_the_unpreemptible():
    # LAS: the job with least attained service first; 4 GPUs in all
    a, b, c = spec(0, 2), spec(1, 2, not_preemptible="driver"), spec(2, 2)
    core = core_with(LeastAttainedService(round_s=60), a, b, c)
    sa, sb, sc = (core.states[i] for i in (0, 1, 2))
    start_on(core, sa, (0, 1))
    start_on(core, sb, (2, 3))
    sa.attained, sb.attained, sc.attained = 50.0, 100.0, 0.0
    d = core.preemptive_round([sa, sb], 10.0)
    # order c, a, b; b cannot be preempted, so it is kept first; then c; a is stopped
    assert d is not None
    assert d.kept == {1, 2} and d.stop == (0,) and d.start == (1, 2)
    # deciding changed nothing: the engine applies the decision
    assert sa.running and sa.preemptions == 0 and set(core.waiting) == {2}
    started = []

    def start(st: JobState, p: Placement) -> None:
        core.allocate(st, p)
        started.append((st.spec.id, p.devices))

    core.release(sa)      # what a simulator does with ``stop``: at once
    sa.running = False
    core.preempted(sa, 10.0)
    core.try_start(d.start, start)
    assert started == [(2, (0, 1))]
    assert sa.preemptions == 1 and sa.waiting_since == 10.0 and set(core.waiting) == {0}


def test_preemptive_round_without_start_leaves_the_kept_waiting():
    core = core_with(LeastAttainedService(round_s=60), spec(0, 4), spec(1, 2))
    d = core.preemptive_round([], 0.0)
    assert d is not None and d.kept == {0} and d.start == (0,) and d.stop == ()
    assert set(core.waiting) == {0, 1}      # the engine's fill pass starts them
    empty = core_with(FIFO())
    assert empty.preemptive_round([], 0.0) is None


@dataclass
class Scripted:
    """An elastic policy that answers what it is told."""

    answer: dict[int, Choice]
    name: str = "scripted"
    uses_remaining: bool = False
    adapts_batch: bool = False
    seen: list = field(default_factory=list)

    def allocate(self, jobs, capacity, now, *, held=None):
        self.seen.append((tuple(jobs), capacity, now, held))
        return self.answer

    def learner_for(self, device_type):
        return None

    def finished(self, jid):
        pass


def test_elastic_round_returns_the_difference():
    pol = Scripted({0: Choice(2, None), 1: Choice(0, None), 2: Choice(3, None),
                    3: Choice(0, None), 4: Choice(1, None)})
    core = core_with(FIFO(), *(spec(i, 1) for i in range(5)), elastic=pol)
    held = {0: (0, 1), 1: (2,), 2: (3,)}
    for jid, devs in held.items():
        core.regang(core.states[jid], len(devs))
        start_on(core, core.states[jid], devs)
    views = [job_view(core.states[j], core.topology, pol, held=j in held, epoch=j,
                      remaining=9.0, limit=2 if j == 2 else 0) for j in range(5)]
    d = core.elastic_round(views, 4, 5.0, held={"v100": 1})
    assert pol.seen[0][1:] == (4, 5.0, {"v100": 1})   # the declared input, passed on
    # 0 unchanged; 1 loses its GPU; 2 grows but its engine gives it at most 2; 3 still
    # waits; 4 starts; the moved ones are placed last, biggest first
    assert [(ch.kind, ch.job, ch.choice.gpus) for ch in d.changes] == [
        ("keep", 0, 2), ("vacate", 1, 0), ("move", 2, 2), ("keep", 3, 0), ("move", 4, 1)]
    assert [(ch.job, ch.choice.gpus) for ch in d.place] == [(2, 2), (4, 1)]
    # a decision, not an action: nothing was released or queued
    assert core.states[1].running and set(core.waiting) == {3, 4}


def test_placement_order_is_biggest_first_then_submission():
    """The one order sim and live place a round's moves in."""
    core = core_with(FIFO(), spec(0, 1), spec(1, 1), spec(2, 1), spec(3, 1))
    st = core.states
    got = placement_order([(1, st[0]), (4, st[3]), (2, st[2]), (4, st[1])])
    assert [s.spec.id for s in got] == [1, 3, 2, 0]


def test_job_view_is_the_same_for_every_engine():
    pol = Scripted({})
    core = core_with(FIFO(), spec(0, 3, batch_size=64), elastic=pol)
    st = core.states[0]
    start_on(core, st, (0, 1, 2))
    st.attained = 30.0
    st.placements.insert(0, (0.0, (3,)))      # it ran before, elsewhere
    v = job_view(st, core.topology, pol, held=True, epoch=4, remaining=7.0)
    # it holds v100s; its trace asked for 3 GPUs; no restart under way
    assert v == JobView(0, "m", 0.0, 4, None, 3, 30.0, 64, ((0, 2), (1, 1)), 1, 0, "v100",
                        False, 3)
    stopping = job_view(st, core.topology, pol, held=False, epoch=4, remaining=7.0)
    assert (stopping.gpus, stopping.placement) == (0, ())
    srpt = Scripted({}, uses_remaining=True)
    assert job_view(st, core.topology, srpt, held=True, epoch=4, remaining=7.0).remaining == 7.0
    # a live job is its own application (its list entry declares its facts)
    live = JobState(spec(1, 1, app="j1"), remaining=1.0)
    assert job_view(live, core.topology, pol, held=False, epoch=0, remaining=None).app == "j1"


def test_the_observer_knows_a_live_jobs_epoch(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text('{"kind": "start"}\n{"kind": "train", "step": 5, "epoch": 0}\n'
                      '{"kind": "eval", "step": 9, "epoch": 1}\n')
    obs = JobObserver(EventTail(events))
    obs.read(nodes=1)
    assert obs.epoch == 1
    with events.open("a") as f:
        f.write('{"kind": "checkpoint", "step": 12, "epoch": 2}\n')
    obs.read(nodes=1)
    assert obs.epoch == 2
