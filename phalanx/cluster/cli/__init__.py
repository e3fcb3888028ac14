"""The scheduler's commands: ``phalanx simulate`` and ``phalanx schedule``."""
