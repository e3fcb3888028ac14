"""The parameter-server wire format: a fixed-size int64 header, then the payload tensors
whose number, dtypes and lengths the header states.

Nothing that crosses a process boundary is pickled. A receiver reads the fixed header
first (it knows its size), validates every field, and only then allocates and receives
the payload the header announces. A header that fails validation raises
:class:`WireError`; the receiver counts it and carries on (it never crashes on input).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

MAGIC = 0x5048_4C58  # "PHLX"
HEADER_LEN = 12
MAX_PAYLOADS = 3
MAX_NUMEL = 1 << 31  # a single payload tensor larger than 8 GiB of float32 is an error

# dtype <-> small integer code (the only dtypes a payload may have)
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
    5: torch.int64,
    6: torch.int32,
    7: torch.int8,  # --compress int8 payloads
}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}


class Kind(IntEnum):
    """Message kinds. Worker -> server: PULL, PUSH, PUSH_PULL, DONE, HEARTBEAT (I am
    alive; sent by a worker's background thread, also while it waits). Server -> worker: PARAMS.
    Server -> server 0 at the end: FINAL (its parameters and counters)."""

    PULL = 1
    PUSH = 2
    DONE = 3
    PARAMS = 4
    FINAL = 5
    HEARTBEAT = 6
    VECTOR = 7  # Sandblaster: coordinator <-> shard vector command / its partial scalars
    TASK = 8  # Sandblaster: coordinator <-> worker portion of a batch / its result
    PUSH_PULL = 9  # a PUSH, then a PULL of the dense slice at the next clock (one message)
    LEFT = 10  # server -> worker, the answer to its resume pull: it was dropped as dead
    #            before the checkpoint the run resumed from, and stays out (ps/checkpoint.py)


class WireError(ValueError):
    """A header that is not a valid phalanx message (the message is rejected)."""


@dataclass(frozen=True)
class Header:
    """The fixed fields of one message.

    ``worker``: worker index (-1 from a server); ``clock``: the worker's push count;
    ``version``: a shard's update count (in PARAMS: now; in PUSH: at the pull the gradient
    was computed on); ``seq``: in a PUSH, its sequence number from this worker to this
    shard (0, 1, 2, ...: the shard applies each number once and counts gaps as lost
    pushes), else 0; ``flags``:
    kind-specific bits (see :mod:`phalanx.ps.shard`); ``payload``: (dtype code, numel)
    of each payload tensor, in order.
    """

    kind: int
    worker: int = -1
    clock: int = 0
    version: int = 0
    shard: int = 0
    seq: int = 0
    flags: int = 0
    payload: tuple[tuple[int, int], ...] = ()

    def encode(self) -> torch.Tensor:
        if len(self.payload) > MAX_PAYLOADS:
            raise WireError(f"at most {MAX_PAYLOADS} payload tensors, got {len(self.payload)}")
        if not 0 <= self.flags < 256:
            raise WireError(f"flags {self.flags} out of range")
        fields = [MAGIC, int(self.kind), self.worker, self.clock, self.version, self.shard,
                  self.seq, self.flags | (len(self.payload) << 8)]
        # one word per payload tensor: numel in the high bits, dtype code in the low 4
        packed = [(numel << 4) | code for code, numel in self.payload]
        packed += [0] * (HEADER_LEN - len(fields) - len(packed))
        return torch.tensor(fields + packed, dtype=torch.int64)

    @staticmethod
    def decode(t: torch.Tensor) -> Header:
        """Validate and decode a received header tensor; raises :class:`WireError`."""
        if t.dtype != torch.int64 or t.numel() != HEADER_LEN:
            raise WireError("header is not an int64 tensor of the expected length")
        v = t.tolist()
        if v[0] != MAGIC:
            raise WireError(f"bad magic {v[0]:#x}")
        try:
            kind = Kind(v[1])
        except ValueError:
            raise WireError(f"unknown message kind {v[1]}") from None
        count = (v[7] >> 8) & 0xFF
        if count > MAX_PAYLOADS or v[7] < 0 or v[7] >> 16:
            raise WireError(f"payload count {count} out of range")
        payload = []
        for packed in v[8 : 8 + count]:
            code, numel = packed & 0xF, packed >> 4
            if code not in DTYPES:
                raise WireError(f"unknown dtype code {code}")
            if not 0 <= numel <= MAX_NUMEL:
                raise WireError(f"payload length {numel} out of range")
            payload.append((code, numel))
        if any(v[8 + count : HEADER_LEN]):
            raise WireError("unused header words are not zero")
        if v[2] < -1 or v[3] < 0 or v[4] < 0 or v[5] < 0 or v[6] < 0:
            raise WireError("negative worker/clock/version/shard/seq")
        return Header(kind=int(kind), worker=v[2], clock=v[3], version=v[4], shard=v[5],
                      seq=v[6], flags=v[7] & 0xFF, payload=tuple(payload))

    def payload_buffers(self) -> list[torch.Tensor]:
        """Empty tensors of the announced dtypes and lengths, to receive the payload into."""
        return [torch.empty(numel, dtype=DTYPES[code]) for code, numel in self.payload]


def describe(tensors: list[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """The header's payload description of ``tensors`` (flattened on the wire)."""
    out = []
    for t in tensors:
        if t.dtype not in DTYPE_CODES:
            raise WireError(f"dtype {t.dtype} cannot be sent")
        out.append((DTYPE_CODES[t.dtype], t.numel()))
    return tuple(out)


HEADER_BYTES = HEADER_LEN * 8
