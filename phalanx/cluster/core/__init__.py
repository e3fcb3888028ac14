"""The scheduler's core: topology, allocator, jobs, the views policies read, and
``SchedulerCore`` (the queue and the rounds every engine shares)."""
