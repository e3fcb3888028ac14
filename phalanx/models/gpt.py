"""A decoder-only transformer (GPT): token and position embeddings, pre-LayerNorm blocks of
causal self-attention and an MLP, a final LayerNorm and an output head.

It is an ``nn.Sequential`` of named top-level layers (``embed``, ``block0`` ...
``block{N-1}``, ``ln_f``, ``head``): those names are its split points, so model-parallel,
pipeline and hybrid training cut it between blocks as they cut any sequential model.
Attention uses separate query, key and value projections and infers its head count from
the projection's width (``view(B, T, -1, head_dim)``), so a tensor-parallel rank that holds
a column slice of them runs the same code on its own heads (Megatron's split).

The input is token ids (B, T), the output logits (B, T, vocabulary). Weights start as
GPT-2's: normal(0, 0.02), the residual projections scaled by 1/sqrt(2 N) (nanoGPT).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F

from phalanx.errors import ConfigError
from phalanx.models.loss import logits_of


class Embeddings(nn.Module):
    """Token + learned position embeddings, then dropout."""

    def __init__(self, vocab: int, context: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[-1]
        if t > self.pos.num_embeddings:
            raise ValueError(f"a sequence of {t} tokens is longer than the context "
                             f"{self.pos.num_embeddings}")
        pos = torch.arange(t, device=idx.device)
        return self.drop(self.tok(idx.long()) + self.pos(pos))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: all of them, or a tensor-parallel rank's share of the columns
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))


class MLP(nn.Module):
    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(x)) (pre-LayerNorm)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# the GPT's named sizes: the --gpt-layers / --gpt-dim / --gpt-heads each one is. 4x128 is
# the default (0.8M parameters on Tiny Shakespeare); 12x512 (38M, GPT-2 small's depth at
# two thirds its width) is the one large enough for memory to matter: its bytes held per
# rank under sync, ZeRO and FSDP are in docs/memory.md
SIZES = {"4x128": {"layers": 4, "dim": 128, "heads": 4},
         "12x512": {"layers": 12, "dim": 512, "heads": 8}}


def gpt(input_shape: tuple[int, ...], num_classes: int, *, layers: int = 4, heads: int = 4,
        dim: int = 128, dropout: float = 0.0) -> nn.Sequential:
    """A GPT over windows of ``input_shape == (context,)`` tokens and a vocabulary of
    ``num_classes``."""
    if len(input_shape) != 1:
        raise ConfigError(f"--model gpt: needs token windows (--data shakespeare or text), "
                          f"got inputs of shape {tuple(input_shape)}")
    if dim % heads:
        raise ConfigError(f"--gpt-dim: {dim} is not a multiple of --gpt-heads {heads}")
    context = int(input_shape[0])
    parts: list[tuple[str, nn.Module]] = [("embed", Embeddings(num_classes, context, dim, dropout))]
    parts += [(f"block{i}", Block(dim, heads, dropout)) for i in range(layers)]
    parts += [("ln_f", nn.LayerNorm(dim)), ("head", nn.Linear(dim, num_classes, bias=False))]
    model = nn.Sequential(OrderedDict(parts))
    for name, p in model.named_parameters():
        if p.dim() >= 2:  # linear and embedding weights; biases zero, LayerNorm 1 / 0
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    return model


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, tokens: int, context: int, *,
             temperature: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Sample ``tokens`` more tokens after ``prompt`` (1-D ids), seeded, in eval mode.

    On the CPU it runs on one intra-op thread: each token is a chain of tiny operations, and
    several threads only wait on each other. Alone, 200 tokens of the default GPT took 0.58 s
    on 1 thread and 0.77 s on 2; with other runs on the machine, each thread's barrier waits
    for a core (3 runs' samples at once on a busy 2-core machine: 15 s each on 2 threads;
    six ``phalanx train`` GPT runs on a 16-core GPU machine, 16 threads each, stuck here
    past a minute, in the GPU check of 2026-11-27)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = prompt.to(device).long().view(1, -1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(tokens):
            logits = logits_of(model(ids[:, -context:]))[:, -1, :].float().cpu()
            logits = logits / max(temperature, 1e-6)
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
            ids = torch.cat([ids, nxt.to(device)], dim=1)
    finally:
        torch.set_num_threads(threads)
        model.train(was)
    return ids[0].cpu()
