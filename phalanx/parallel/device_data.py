"""Batches on a rank's device: the training set moved there once and indexed there
(``--data-on-device``), or indexed on the host and each batch copied over.

On the CPU this is exactly ``x[idx], y[idx]`` (same tensors, same results as before).
Augmentations draw from a host generator, so an augmented batch is built on the host
and then copied: the random stream, and so the batch, is the same on every device.
"""

from __future__ import annotations

import torch

from phalanx.data import Dataset


class DeviceData:
    def __init__(self, data: Dataset, device: torch.device | str = "cpu",
                 on_device: bool = False, augmented: bool = False) -> None:
        self.device = torch.device(device)
        self.host_x, self.host_y = data.x, data.y
        self.resident = self.device.type != "cpu" and on_device and not augmented
        if self.resident:
            # one copy for the whole run; batches are then indexed on the device
            self.x, self.y = data.x.to(self.device), data.y.to(self.device)

    def batch(self, idx: torch.Tensor, aug=None, gen: torch.Generator | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.resident:
            idx = idx.to(self.device, non_blocking=True)
            return self.x[idx], self.y[idx]
        x, y = self.host_x[idx], self.host_y[idx]
        if aug is not None:
            x = aug(x, gen)
        if self.device.type != "cpu":
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x, y


def train_bytes(job) -> int:
    """Bytes of the training set (what a rank would move to its device)."""
    x, y = job.train.x, job.train.y
    return x.numel() * x.element_size() + y.numel() * y.element_size()
