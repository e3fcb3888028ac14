"""Batch augmentations as composable callables ``(x, generator) -> x`` on (B, C, H, W)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from phalanx.errors import ConfigError

Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def flip(p: float = 0.5) -> Transform:
    def apply(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        mask = torch.rand(x.shape[0], generator=g) < p
        out = x.clone()
        out[mask] = x[mask].flip(-1)
        return out

    return apply


def translate(max_shift: int = 2) -> Transform:
    def apply(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        b, _, h, w = x.shape
        pad = F.pad(x, (max_shift,) * 4)
        dx = torch.randint(0, 2 * max_shift + 1, (b,), generator=g)
        dy = torch.randint(0, 2 * max_shift + 1, (b,), generator=g)
        rows = (dy[:, None] + torch.arange(h)[None, :])  # (B, H)
        cols = (dx[:, None] + torch.arange(w)[None, :])  # (B, W)
        bi = torch.arange(b)[:, None, None]
        return pad.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)

    return apply


def rotate(max_degrees: float = 10.0) -> Transform:
    def apply(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        angle = (torch.rand(x.shape[0], generator=g) * 2 - 1) * math.radians(max_degrees)
        cos, sin = angle.cos(), angle.sin()
        theta = torch.stack(
            [torch.stack([cos, -sin, torch.zeros_like(cos)], 1),
             torch.stack([sin, cos, torch.zeros_like(cos)], 1)], 1
        )
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False, padding_mode="border")

    return apply


def noise(std: float = 0.1) -> Transform:
    def apply(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return x + std * torch.randn(x.shape, generator=g)

    return apply


def compose(transforms: Sequence[Transform]) -> Transform:
    def apply(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        for t in transforms:
            x = t(x, g)
        return x

    return apply


AUGMENTATIONS: dict[str, Callable[[], Transform]] = {
    "flip": flip,
    "translate": translate,
    "rotate": rotate,
    "noise": noise,
}


def parse_augment(spec: str) -> Transform | None:
    """``"flip,translate"`` -> one composed transform (None for an empty spec)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in AUGMENTATIONS:
            raise ConfigError(f"--augment: {name!r} is not one of {', '.join(AUGMENTATIONS)}")
    return compose([AUGMENTATIONS[n]() for n in names]) if names else None
