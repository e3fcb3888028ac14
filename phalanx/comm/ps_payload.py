"""The compression layer's parameter-server messages: a received PUSH's compressed gradient
decoded (or why it is bad), and :class:`PullDeltas`, the shard's side of compressed pulls
with its integrity check (:func:`~phalanx.comm.compress.checksum`)."""

from __future__ import annotations

import torch

from phalanx.comm.compress import (
    CODEC_MASK,
    CODEC_SHIFT,
    WIRE_CODECS,
    Codec,
    DecodeError,
    RandK,
    checksum,
    decode_payload,
    finite,
)


def decode_push(flags: int, tensors: list[torch.Tensor],
                numel: int) -> tuple[list[torch.Tensor], str]:
    """A received PUSH's payload with its dense gradient decoded (unchanged when the flags
    name no codec), and why it is bad ("" when it is not)."""
    if not flags & CODEC_MASK or not tensors:
        return tensors, ""
    try:
        return [decode_payload(flags, tensors[0], numel), *tensors[1:]], ""
    except DecodeError as e:
        return tensors, f"bad compressed gradient ({e})"


class PullDeltas:
    """The shard's side of compressed pulls: per worker, the copy of the dense slice that
    worker holds. A pull is answered with the compressed difference between the shard's
    parameters and that copy, and the copy moves by exactly what the worker will decode —
    so what one reply leaves out is in the next one (error feedback without a residual).
    Every few pulls the worker sends a :func:`checksum` of its copy (:meth:`matches`); a
    mismatch (a reply lost or mangled on the way) is answered with the full slice."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.copies: dict[int, torch.Tensor] = {}
        self._replies = 0

    def reply(self, worker: int, dense: torch.Tensor, fresh: bool) -> tuple[torch.Tensor, int]:
        """(payload, codec flag bits) for ``worker``; ``fresh``: it holds nothing we know of
        (first pull, a restarted worker, a failed checksum) and gets the full slice."""
        copy = self.copies.get(worker)
        delta = dense - copy if copy is not None and not fresh else None
        if delta is None or not finite(delta):
            # non-finite: the shard's own parameters diverged; the worker gets them whole
            # (a delta would not decode) and its loss says so
            self.copies[worker] = dense.clone()
            return dense, 0
        delta.clamp_(-self.codec.limit, self.codec.limit)  # the rest comes next time
        self._replies += 1
        t = (self.codec.encode(delta, self._replies) if isinstance(self.codec, RandK)
             else self.codec.encode(delta))
        copy += self.codec.decode(t, delta.numel())
        return t, WIRE_CODECS.index(self.codec.name) << CODEC_SHIFT

    def matches(self, worker: int, crc: int) -> bool:
        """The worker's copy (its :func:`checksum` ``crc``) is the one we hold for it."""
        copy = self.copies.get(worker)
        return copy is not None and checksum(copy) == crc

    def held(self, worker: int) -> torch.Tensor | None:
        """The parameters ``worker`` holds now (DC-ASGD's backup), if known."""
        return self.copies.get(worker)
