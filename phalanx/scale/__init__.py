"""``phalanx scale``: a training-protocol simulator (docs/scale.md).

Three layers, each checkable by hand: the workload (:mod:`.workload`: layers, compute, the
bytes a step must exchange), the system (:mod:`.collectives`, :mod:`.overlap`,
:mod:`.predict`, :mod:`.eventsim`: algorithms and protocols as phases of flows and queues),
and the network (:mod:`.network`: alpha-beta links per level of the scheduler's topology).
The analytical core imports no torch; only :mod:`.profile` (``--profile-here``) does.
"""
