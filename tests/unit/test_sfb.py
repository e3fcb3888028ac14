"""Sufficient factors: the factor / rebuild math, in one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.allreduce import RingAllReduce
from phalanx.comm.bucketing import CommThread
from phalanx.comm.sfb import SufficientFactors, pack, rebuild, unpack, use_factors


def _factors(layer: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """U = dL/dy, V = x for one batch, captured the way SufficientFactors does (tensor hook)."""
    captured = {}
    y = layer(x)
    y.register_hook(lambda g: captured.__setitem__("u", g))
    (y.sin().sum() / len(x)).backward()
    return captured["u"], x


def test_rebuilt_factors_equal_the_autograd_weight_gradient() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(300, 200)
    x = torch.randn(8, 300)
    u, v = _factors(layer, x)
    assert torch.allclose(rebuild(u, v), layer.weight.grad, rtol=0, atol=1e-7)
    # exactly the product autograd computes for a Linear weight: grad_output^T @ input
    assert torch.equal(rebuild(u, v), u.t().mm(v))


def test_sum_of_workers_factors_equals_the_gradient_of_the_joint_batch() -> None:
    torch.manual_seed(1)
    layer = nn.Linear(64, 32)
    xs = [torch.randn(4, 64) for _ in range(3)]  # three workers' batches
    total = torch.zeros(32, 64)
    for x in xs:
        layer.zero_grad()
        u, v = _factors(layer, x)
        total += rebuild(u, v)
    layer.zero_grad()
    joint = torch.cat(xs)
    (layer(joint).sin().sum() / 4).backward()
    assert torch.allclose(total, layer.weight.grad, atol=1e-5)


def test_pack_unpack_round_trip() -> None:
    u, v = torch.randn(5, 7), torch.randn(5, 3)
    u2, v2 = unpack(pack(u, v), 5, 7, 3)
    assert torch.equal(u, u2) and torch.equal(v, v2)


def test_factors_are_chosen_only_when_smaller_than_the_ring() -> None:
    # gather sends (N-1) B (m+n); ring allreduce sends 2 m n (N-1)/N
    assert use_factors(16, 256, 256, 2)  # 2*16*512 = 16k < 2*65k
    assert not use_factors(256, 256, 256, 2)  # 2*256*512 = 262k > 131k
    assert not use_factors(16, 10, 128, 2)  # a thin output layer: the matrix is smaller
    assert not use_factors(1, 256, 256, 1)  # one worker sends nothing either way
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    assert [m.out_features for m in SufficientFactors.plan(model, 16, 2)] == [256, 128]
    assert SufficientFactors.plan(model, 512, 2) == []


@pytest.fixture
def one_rank_group():
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_factored_gradient_of_a_layer_used_twice_with_accumulation(one_rank_group) -> None:
    """The hooks pair each forward call's input with its own output gradient, across
    micro-steps; the rebuilt gradient equals autograd's."""
    torch.manual_seed(2)
    shared, head = nn.Linear(40, 40), nn.Linear(40, 3)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return head(torch.relu(shared(torch.relu(shared(x)))))

    comm = CommThread()
    sfb = SufficientFactors([shared], RingAllReduce(), 1, comm)
    xs, ys = torch.randn(2, 4, 40), torch.randint(0, 3, (2, 4))
    for micro in range(2):
        sfb.begin(sync=micro == 1)
        nn.functional.cross_entropy(forward(xs[micro]), ys[micro]).backward()
    autograd_grad = shared.weight.grad.clone()
    comm.wait()
    sfb.finish()
    assert torch.allclose(shared.weight.grad, autograd_grad, atol=1e-6)
    assert not torch.equal(autograd_grad, torch.zeros_like(autograd_grad))
    comm.close()
    sfb.remove()
