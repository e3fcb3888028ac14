"""The chaos harness's view of a driver's ranks (``phalanx.cluster.chaos.procs``): rank
order is start order, and start order survives the pid wrap."""

from __future__ import annotations

import os

from phalanx.cluster.chaos.procs import Proc, children, in_start_order, scan


def proc(pid: int, started: int, ppid: int = 1) -> Proc:
    return Proc(pid, ppid, "python", "S", started, ("python",))


def test_ranks_forked_in_one_clock_tick_keep_their_order_across_the_pid_wrap():
    # a shard and two workers forked within one tick (10 ms): the shard got the last pid
    # before the wrap at 32,768, the workers the first after it (the kernel restarts at 300)
    got = in_start_order([proc(301, 500), proc(32_760, 500), proc(302, 500)], pid_max=32_768)
    assert [p.pid for p in got] == [32_760, 301, 302]
    # no wrap: ties by pid; an earlier tick first whatever its pid
    got = in_start_order([proc(4_002, 500), proc(4_001, 500), proc(9_000, 499)],
                         pid_max=32_768)
    assert [p.pid for p in got] == [9_000, 4_001, 4_002]


def test_scan_sees_this_process_and_children_are_its_live_ones_oldest_first():
    me = scan()[os.getpid()]
    assert me.started > 0 and me.state not in ("Z", "X") and me.argv
    table = {p.pid: p for p in (proc(7, 100), proc(901, 105, ppid=7), proc(900, 105, ppid=7),
                                proc(800, 104, ppid=7), proc(902, 99, ppid=1))}
    table[903] = Proc(903, 7, "python", "Z", 106, ())  # a zombie: not a live child
    assert [p.pid for p in children(table, 7)] == [800, 900, 901]
