"""Event log, progress output, TensorBoard, plots."""

from phalanx.metrics.events import EventLog, read_events
from phalanx.metrics.progress import Progress

__all__ = ["EventLog", "Progress", "read_events"]
