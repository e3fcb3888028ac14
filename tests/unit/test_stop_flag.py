"""The stop flag's SIGTERM handler (runtime/stop_flag.py) runs again inside itself when a
second SIGTERM comes while it runs (the driver repeats SIGTERM every 0.2 s until a rank
ends). It took a lock (``threading.Event.set``): cut while holding it, the second handler
waited for the first for ever, and a preempted shard hung until killed (a stack dump
showed it). Here a tracer sends SIGTERM at every line the handler and what it calls run,
so a second handler starts at each point the first can be cut: the process must finish."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, signal, sys
from phalanx.runtime import stop_flag
stop_flag.arm()
sent, depth = [0], [0]

def tracer(frame, event, arg):
    if event == "line" and sent[0] < 30:
        sent[0] += 1
        os.kill(os.getpid(), signal.SIGTERM)
    return tracer

def traced(signum, frame, handle=stop_flag._STOP.handle):
    depth[0] += 1
    sys.settrace(tracer)
    try:
        handle(signum, frame)
    finally:
        depth[0] -= 1
        if depth[0] == 0:
            sys.settrace(None)

signal.signal(signal.SIGTERM, traced)
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(1000):
    pass
print(stop_flag.requested(), sent[0])
"""


def test_a_sigterm_inside_the_handler_does_not_deadlock() -> None:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()  # SIGTERM is the flag's: it would not end the process
        p.communicate()
        raise AssertionError("the handler, run again inside itself, waited for itself") \
            from None
    assert p.returncode == 0, err
    requested, sent = out.split()
    assert requested == "True" and int(sent) >= 2  # a SIGTERM came while it ran
