"""Training strategies, one module each; each ends with a
:class:`~phalanx.parallel.spec.StrategySpec` that :mod:`phalanx.parallel.registry` lists."""
