"""Scheduling policies: admission, ordering, placement (one small class each)."""

from phalanx.cluster.policies.admission import (
                                                AcceptAll,
                                                AdmissionDecision,
                                                AdmissionPolicy,
                                                VirtualClusterQuota,
                                                parse_quota,
)
from phalanx.cluster.policies.ordering import (
                                                FIFO,
                                                ORDERINGS,
                                                LeastAttainedService,
                                                OrderingPolicy,
                                                RoundRobin,
                                                ShortestJobFirst,
                                                Tiresias,
                                                make_ordering,
)
from phalanx.cluster.policies.placement import (
                                                FirstFit,
                                                LoadAdaptive,
                                                Pack,
                                                PlacementPolicy,
                                                Spread,
                                                TopologyAware,
)
from phalanx.cluster.policies.placement_catalog import PLACEMENTS, make_placement

__all__ = [
                                                "FIFO",
                                                "ORDERINGS",
                                                "PLACEMENTS",
                                                "AcceptAll",
                                                "AdmissionDecision",
                                                "AdmissionPolicy",
                                                "FirstFit",
                                                "LeastAttainedService",
                                                "LoadAdaptive",
                                                "OrderingPolicy",
                                                "Pack",
                                                "PlacementPolicy",
                                                "RoundRobin",
                                                "ShortestJobFirst",
                                                "Spread",
                                                "Tiresias",
                                                "TopologyAware",
                                                "VirtualClusterQuota",
                                                "make_ordering",
                                                "make_placement",
                                                "parse_quota",
]
