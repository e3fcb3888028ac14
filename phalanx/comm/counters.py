"""Byte counters: every transport and collective counts what it moves, per rank."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ByteCounter:
    sent: int = 0
    received: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    def on_send(self, nbytes: int) -> None:
        self.sent += int(nbytes)
        self.messages_sent += 1

    def on_recv(self, nbytes: int) -> None:
        self.received += int(nbytes)
        self.messages_received += 1


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
