"""Imported last by the fork server (``supervise.process_context``): when its preloading
ended. A rank forked from the server inherits this module, so its start-up phases can
tell the server's imports (paid by the run that started the server) from its own fork.

The fork server ignores SIGTERM: a scheduler stops a run by signalling its whole process
group, and the ranks are the server's children (``PR_SET_PDEATHSIG``: they die with it).
A parameter-server shard answers SIGTERM with a checkpoint, which takes a moment; the
server must not die first and take it down. The server still ends with the driver (its
pipe from the driver closes), and every rank sets its own SIGTERM action
(``signals.child_setup``)."""

from __future__ import annotations

import signal
import time

AT = time.time()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
