"""Multi-node tests run on test hosts (network namespaces): the ``network`` fixture."""

from hosts import network  # noqa: F401
