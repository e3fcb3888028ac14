"""Imported last by the fork server (``supervise.process_context``): when its preloading
ended. A rank forked from the server inherits this module, so its start-up phases can
tell the server's imports (paid by the run that started the server) from its own fork."""

from __future__ import annotations

import time

AT = time.time()
