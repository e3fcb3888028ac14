"""Tensor-parallel plans for user models (``parallel/tensor_plans.py``, issue 47): a plan
derived for separate q/k/v projections and two-layer MLPs, or the model's own
``tensor_plan``; a model split by either trains under ``--strategy tensor`` (real
processes, 2 ranks) equal to single-process training; what cannot be split is one line."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel.equivalence import max_state_diff, reference_training
from phalanx.parallel.tensor_plans import check_plan, derived_plan


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, fixed_heads: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim)
                                                              for _ in range(4))
        self.head_dim, self.heads, self.fixed = dim // heads, heads, fixed_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        heads = self.heads if self.fixed else -1  # -1: from the projection's width
        q, k, v = (f(x).view(b, t, heads, self.head_dim).transpose(1, 2)
                   for f in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, fixed_heads: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.self_attn = Attention(dim, heads, fixed_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LlamaShaped(nn.Module):
    """q_proj/k_proj/v_proj/o_proj and an MLP in each of ``layers`` (Hugging Face's names)."""

    def __init__(self, vocab: int = 65, context: int = 32, dim: int = 32, heads: int = 2,
                 fixed_heads: bool = False, plan: dict | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, fixed_heads) for _ in range(2))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if plan is not None:
            self.tensor_plan = plan

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


MLP_ONLY = {f"layers.{i}": {"mlp.0": "colwise", "mlp.2": "rowwise"} for i in range(2)}


def llama() -> nn.Module:
    return LlamaShaped()


def llama_mlp_only() -> nn.Module:
    return LlamaShaped(plan=MLP_ONLY)


SAMPLE = torch.randint(0, 65, (2, 32))


def test_a_plan_is_derived_for_separate_qkv_and_mlp():
    assert derived_plan(llama()) == {f"layers.{i}": {
        "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
        "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
        "mlp.0": "colwise", "mlp.2": "rowwise"} for i in range(2)}
    assert check_plan(llama_mlp_only(), SAMPLE, 2) == MLP_ONLY  # the model's own first


@pytest.mark.parametrize(("model", "world", "says"), [
    (lambda: LlamaShaped(fixed_heads=True), 2, "its forward fails with its layers split over "
     "2 ranks (RuntimeError"),
    (lambda: nn.Sequential(nn.Linear(4, 4)), 2, "has no tensor-parallel plan"),
    (lambda: LlamaShaped(plan={"layers.0": {"norm1": "colwise"}}), 2,
     "splits layers.0.norm1, a LayerNorm, not an nn.Linear"),
    (lambda: LlamaShaped(plan={"layers.0": {"mlp.0": "diagonal"}}), 2,
     "has no tensor-parallel plan"),
    (llama, 3, "--workers: 3 ranks cannot share the 32 columns of layers.0.self_attn.q_proj"),
])
def test_what_cannot_be_split_is_one_line(model, world, says):
    with pytest.raises(ConfigError) as e:
        check_plan(model(), SAMPLE, world)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("factory", [llama, llama_mlp_only])
def test_a_user_model_trains_under_tensor_equal_to_single(tmp_path, factory):
    opts = {"data": "shakespeare", "train_limit": 480, "test_limit": 64, "context": 32,
            "batch_size": 8, "max_steps": 12, "rule": "momentum", "lr": 0.05,
            "worker_threads": 1, "progress": False, "tensorboard": False,
            "eval_every": 10**6, "strategy": "tensor", "workers": 2,
            "out": str(tmp_path / "run")}
    result = phalanx.train(factory, **opts)
    cfg = RunConfig.from_mapping({**opts, "model": "mlp"}).validate()
    ref = reference_training(make_job(cfg, factory), 12)
    assert set(result.model.state_dict()) == set(factory().state_dict())
    diff = max_state_diff(result.model.state_dict(), ref.state)
    assert diff <= 1e-5, diff
    assert result.summary["split_blocks"] == 2
    assert result.summary["test_loss"] < math.log(65) - 0.3


def test_q_k_v_share_one_input_all_reduce():
    """The attention's q, k and v (three column-split layers under one parent) take its
    input as one replicated tensor: backward all-reduces that input's gradient once, not
    once per projection (the kernel counted 24 activation all-reduces a step for 4 GPT
    blocks before, 16 after: docs/scale.md). A lone column-split layer (the MLP's fc) and
    layers directly under the block need no such parent."""
    from phalanx.parallel.tensor_parallel import shared_inputs

    gpt = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
           "attn.proj": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
    assert shared_inputs(gpt) == ["attn"]
    assert shared_inputs({"q": "colwise", "k": "colwise", "o": "rowwise"}) == []
    assert shared_inputs({"self_attn.q_proj": "colwise", "self_attn.o_proj": "rowwise",
                          "mlp.up": "colwise", "mlp.gate": "colwise",
                          "mlp.down": "rowwise"}) == ["mlp"]
