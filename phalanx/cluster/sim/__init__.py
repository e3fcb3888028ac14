"""The simulators: trace readers, the event engine, the interval engine, and one entry for a run
(options, presets)."""
