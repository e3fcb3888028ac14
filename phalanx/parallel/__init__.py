"""Training strategies, one module each. Each module has ``run(job, log) -> Outcome``."""

from __future__ import annotations

import importlib
from types import ModuleType

from phalanx.errors import ConfigError

# strategy name -> module that implements it
STRATEGY_MODULES = {
    "single": "phalanx.parallel.single",
    "sync": "phalanx.parallel.sync_dp",
    "average": "phalanx.parallel.model_averaging",
    "bsp": "phalanx.parallel.ps",
    "asp": "phalanx.parallel.ps",
    "ssp": "phalanx.parallel.ps",
    "softsync": "phalanx.parallel.ps",
    "downpour": "phalanx.parallel.ps",
    "dc-asgd": "phalanx.parallel.ps",
    "hogwild": "phalanx.parallel.hogwild",
    "model-parallel": "phalanx.parallel.model_parallel",
    "pipeline": "phalanx.parallel.pipeline",
    "hybrid": "phalanx.parallel.hybrid",
    "sandblaster": "phalanx.parallel.sandblaster",
}


def strategy_module(name: str) -> ModuleType:
    if name not in STRATEGY_MODULES:
        raise ConfigError(f"--strategy: {name!r} is not one of {', '.join(STRATEGY_MODULES)}")
    path = STRATEGY_MODULES[name]
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name == path:
            raise ConfigError(f"--strategy: {name!r} is not built yet ({path} missing)") from None
        raise
