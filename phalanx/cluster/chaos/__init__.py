"""Chaos: a live schedule of short real jobs under random, seeded faults, and the
invariants every run must keep (``phalanx chaos``; docs/faults.md, "Chaos: random faults
under load").

* :mod:`jobs` the job mix (sync, compressed sync, ASP, SSP, pipeline, a GPT, a click model);
* :mod:`faults` the fault kinds, the seeded plan, and how each is injected;
* :mod:`procs` what runs on this host, read from ``/proc`` (ranks, shards, fork servers);
* :mod:`watch` what is checked while the schedule runs (the state file, jobs run twice);
* :mod:`invariants` the checks after a run, one function per invariant;
* :mod:`harness` one seeded run; :mod:`report` the table over runs.
"""
