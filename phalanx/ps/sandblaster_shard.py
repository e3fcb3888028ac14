"""A Sandblaster L-BFGS shard: one slice of the parameters AND of the L-BFGS vectors.

The shard keeps, on its slice, the accepted point x, the point it serves to workers
(``x + t d`` during a line search), the direction d, the gradient g, the history pairs
(s_i, y_i) and the gradient being accumulated from the workers' portions. It executes the
coordinator's vector commands (:data:`Op`) and answers with partial scalars; workers
pull the served point (PULL -> PARAMS) and push the summed gradient of one portion
(PUSH, ``clock`` = evaluation id, ``seq`` = portion). The first push of a portion counts;
later ones (backup tasks, re-issued portions: the same samples at the same point, so the
same sum) and pushes for an evaluation that is over are counted as wasted and dropped.

:class:`SandblasterShard` is the state machine (no transport, tested directly);
:func:`serve_shard` runs it over a transport until the coordinator says STOP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch

from phalanx.comm.transport import PeerLost, Transport
from phalanx.comm.wire import Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.ps.vector_lbfgs import GradientDots


class Op(IntEnum):
    """Coordinator -> shard commands (``Header.flags``); the reply carries the same op.
    ``clock`` is the evaluation id the command is about."""

    DIRECTION = 1  # [accept_pair, t, c_0 .. c_2h]: keep the pair?, d = sum c_j b_j, serve x + t d
    TRIAL = 2  # [t]: serve x + t d (a line-search trial along the same d)
    ACCEPT = 3  # [portions, samples]: once every portion is in, g = sum / samples, x = point
    FETCH = 4  # []: the served point (evaluation, final model)
    STOP = 5  # []: counters, then the shard exits


STOPPED = "stopped"
SHARD_STATS = ("pushes_applied", "pushes_wasted", "messages_rejected")


@dataclass
class ShardCounters:
    pushes_applied: int = 0
    pushes_wasted: int = 0  # duplicate portions (backup tasks) and pushes for past evaluations
    messages_rejected: int = 0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([float(getattr(self, k)) for k in SHARD_STATS], dtype=torch.float64)


@dataclass
class SandblasterShard:
    shard: int
    x: torch.Tensor  # the accepted point (float64 slice)
    history: int
    counters: ShardCounters = field(default_factory=ShardCounters)

    def __post_init__(self) -> None:
        self.x = self.x.detach().double().clone().reshape(-1)
        self.point = self.x.clone()  # what workers are served
        self.d = torch.zeros_like(self.x)
        self.t = 0.0  # step of the served point along d
        self.g: torch.Tensor | None = None
        self.s_hist: list[torch.Tensor] = []
        self.y_hist: list[torch.Tensor] = []
        self.candidate: tuple[torch.Tensor, torch.Tensor] | None = None
        self.serving = 0  # evaluation id of the served point (0: x0)
        self.acc = torch.zeros_like(self.x)
        self.seen: set[int] = set()
        self.pending: Header | None = None  # an ACCEPT waiting for missing portions
        self._pending_args: list[float] = []

    # ---- workers -------------------------------------------------------------------------

    def pull(self, evaluation: int) -> tuple[int, torch.Tensor]:
        """The served point, if the worker asks for the current evaluation; an empty
        answer tells a worker holding an outdated portion to skip it."""
        if evaluation == self.serving:
            return self.serving, self.point.float()
        if evaluation > self.serving:
            self.counters.messages_rejected += 1  # cannot happen with a sane coordinator
        return self.serving, torch.zeros(0)

    def push(self, evaluation: int, portion: int, grad: torch.Tensor) -> None:
        if grad.numel() != self.x.numel():
            self.counters.messages_rejected += 1
            return
        if evaluation != self.serving or portion in self.seen:
            self.counters.pushes_wasted += 1
            return
        self.acc += grad.double()
        self.seen.add(portion)
        self.counters.pushes_applied += 1

    # ---- coordinator commands -----------------------------------------------------------

    def _serve(self, evaluation: int, t: float) -> None:
        self.t = t
        self.point = self.x + t * self.d
        self.serving = evaluation
        self.acc.zero_()
        self.seen.clear()

    def direction(self, evaluation: int, args: list[float]) -> torch.Tensor:
        accept_pair, t, coeffs = bool(args[0]), args[1], args[2:]
        if accept_pair:
            if self.candidate is None:
                raise PhalanxError(f"sandblaster shard {self.shard}: DIRECTION keeps a pair "
                                   "that does not exist")
            if len(self.s_hist) == self.history:
                self.s_hist.pop(0)
                self.y_hist.pop(0)
            self.s_hist.append(self.candidate[0])
            self.y_hist.append(self.candidate[1])
        self.candidate = None
        basis = [*self.s_hist, *self.y_hist, self.g]
        if len(coeffs) != len(basis) or self.g is None:
            raise PhalanxError(f"sandblaster shard {self.shard}: DIRECTION with {len(coeffs)} "
                               f"coefficients for a basis of {len(basis)}")
        d = torch.zeros_like(self.x)
        for c, b in zip(coeffs, basis):
            d.add_(b, alpha=c)
        self.d = d
        self._serve(evaluation, t)
        return torch.tensor([d.abs().max().item() if d.numel() else 0.0], dtype=torch.float64)

    def trial(self, evaluation: int, args: list[float]) -> torch.Tensor:
        self._serve(evaluation, args[0])
        return torch.zeros(0, dtype=torch.float64)

    def ready(self, evaluation: int, portions: int) -> bool:
        return evaluation == self.serving and len(self.seen) >= portions

    def accept(self, evaluation: int, args: list[float]) -> torch.Tensor:
        """The evaluation is complete: its mean gradient becomes g, its point becomes x.
        Returns the partial sums of :class:`GradientDots`."""
        portions, samples = int(args[0]), args[1]
        if evaluation != self.serving or not self.ready(evaluation, portions):
            raise PhalanxError(f"sandblaster shard {self.shard}: ACCEPT of evaluation "
                               f"{evaluation} before its portions arrived")
        g = self.acc / samples
        if self.g is not None:
            s, y = self.t * self.d, g - self.g
        else:
            s = y = torch.zeros_like(g)
        self.candidate = (s, y) if self.g is not None else None
        self.g, self.x = g, self.point.clone()

        def dots(v: torch.Tensor, vs: list[torch.Tensor]) -> list[float]:
            return [float(v @ u) for u in vs]

        head = [float(g @ g), float(g @ s), float(g @ y), float(s @ s), float(s @ y),
                float(y @ y), float(g.abs().sum()), float(g.abs().max()) if g.numel() else 0.0]
        sh, yh = self.s_hist, self.y_hist
        body = (dots(g, sh) + dots(g, yh) + dots(s, sh) + dots(s, yh) + dots(y, sh)
                + dots(y, yh))
        out = torch.tensor(head + body, dtype=torch.float64)
        assert out.numel() == GradientDots.length(len(sh))
        return out

    def handle_command(self, header: Header, args: torch.Tensor) -> torch.Tensor | str | None:
        """Run one command; ``None``: an ACCEPT that waits for portions (kept pending)."""
        values = args.tolist()
        op = header.flags
        if op == Op.DIRECTION:
            return self.direction(header.clock, values)
        if op == Op.TRIAL:
            return self.trial(header.clock, values)
        if op == Op.ACCEPT:
            if not self.ready(header.clock, int(values[0])):
                self.pending = header
                self._pending_args = values
                return None
            return self.accept(header.clock, values)
        if op == Op.FETCH:
            return self.point.clone()
        if op == Op.STOP:
            return STOPPED
        raise PhalanxError(f"sandblaster shard {self.shard}: unknown command {op}")

    def release(self) -> torch.Tensor | None:
        """The pending ACCEPT's answer once its last portion arrived."""
        if self.pending is None or not self.ready(self.pending.clock, int(self._pending_args[0])):
            return None
        header, self.pending = self.pending, None
        return self.accept(header.clock, self._pending_args)


def serve_shard(state: SandblasterShard, transport: Transport, coordinator: int,
                is_worker) -> None:
    """Run ``state`` until the coordinator's STOP. ``is_worker(rank)`` says who may pull and
    push. A dead worker is not this loop's business: the coordinator re-issues its
    portions, and a broken connection here is only counted."""
    lost = 0

    def reply(op: int, evaluation: int, payload: torch.Tensor) -> None:
        counters = torch.tensor([transport.counter.sent, transport.counter.received],
                                dtype=torch.int64)
        # the last answer travels on the control channel (kind FINAL), which the
        # coordinator can still read after a receive from its workers timed out
        kind = Kind.FINAL if op == Op.STOP else Kind.VECTOR
        transport.send(coordinator, Header(kind, shard=state.shard, clock=evaluation,
                                           flags=op), [payload, counters])

    while True:
        try:
            msg = transport.recv()
        except WireError:
            state.counters.messages_rejected += 1
            continue
        except PeerLost:
            lost += 1  # a worker died (gloo does not say which); bounded: never spin
            if lost > 64:
                raise PhalanxError(f"sandblaster shard {state.shard}: connections keep "
                                   "breaking") from None
            continue
        h, src = msg.header, msg.src
        if src == coordinator and h.kind == Kind.VECTOR and len(msg.tensors) == 1:
            out = state.handle_command(h, msg.tensors[0])
            if out is STOPPED:
                reply(Op.STOP, h.clock, state.counters.as_tensor())
                transport.flush()
                return
            if out is not None:
                reply(h.flags, h.clock, out)
        elif is_worker(src) and h.kind == Kind.PULL:
            version, point = state.pull(h.clock)
            try:
                transport.send(src, Header(Kind.PARAMS, worker=h.worker, shard=state.shard,
                                           clock=version), [point])
            except PeerLost:
                lost += 1
        elif is_worker(src) and h.kind == Kind.PUSH and len(msg.tensors) == 1:
            state.push(h.clock, h.seq, msg.tensors[0])
            done = state.release()
            if done is not None:
                reply(Op.ACCEPT, state.serving, done)
        else:
            state.counters.messages_rejected += 1
