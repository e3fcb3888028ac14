"""One parameter-server shard as a state machine: messages in, replies out.

No transport and no clock in here, so the logic is tested deterministically by feeding it
messages (see ``tests/unit/test_ps_shard.py``); :mod:`phalanx.ps.server` runs it over a
transport. The shard owns its slice of the parameters and the server-side optimizer state
(any :mod:`phalanx.rules` rule, e.g. Downpour's AdaGrad, DC-ASGD, staleness scaling).

Staleness of an applied gradient = the shard's version (updates applied so far) when it is
applied minus the version the worker had pulled when it computed it.

Faults: every push carries its sequence number (``seq``: 0, 1, 2, ... from one worker to
this shard, which is also the worker's clock). The shard applies each number at most once
(a repeat is a *duplicate*, ignored) and a gap — a push, pull or DONE whose number is
ahead of the next expected push — means pushes were lost on the way: they are counted
(``pushes_lost``) and end the worker's iteration like a rejected push, so no barrier waits
for them. :meth:`ShardState.drop_worker` removes a dead worker; the consistency models
then count the live workers only.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from phalanx.comm.compress import CODEC_MASK, finite
from phalanx.comm.ps_payload import PullDeltas, decode_push
from phalanx.comm.wire import Header, Kind
from phalanx.ps import noise_part
from phalanx.ps.consistency import Consistency
from phalanx.ps.partition import Partition
from phalanx.ps.row_state import gather_rows, scatter_rows
from phalanx.ps.updater import Updater
from phalanx.rules import UpdateRule, apply_updates, update_owned

WANT_DENSE = 1  # PULL flag: send the dense slice (else only the requested rows)
HAS_ROWS = 2  # PULL / PUSH flag: the payload carries sparse row ids (+ row gradients)
RESUME = 4  # PULL flag: a restarted worker asks where it stands (the reply's clock)
# (bits 3..5: the codec of a compressed payload, phalanx.comm.compress.CODEC_MASK)
SKIPPED = 64  # PUSH flag: the worker's gradient held NaN or inf and was not sent (no payload)
CHECKED = 128  # PULL flag: the last payload is the CRC-32 of the worker's copy (int64[1])
MAX_GAP = 1024  # more pushes lost in a row than this: the message is rejected as bogus


@dataclass
class Outgoing:
    worker: int
    header: Header
    tensors: list[torch.Tensor]


@dataclass
class Pending:
    """A push waiting in the buffer (``dense is None``: rejected, counts only for the clock)."""

    worker: int
    clock: int
    version: int
    dense: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    rows: torch.Tensor | None = None


@dataclass
class ShardStats:
    pushes_applied: int = 0
    pushes_rejected: int = 0
    messages_rejected: int = 0
    updates: int = 0
    pushes_lost: int = 0  # sequence gaps: pushes that never arrived
    duplicates: int = 0  # pushes whose sequence number was already applied (ignored)
    pull_resyncs: int = 0  # compressed pulls answered in full: the worker's copy had drifted
    workers_lost: int = 0  # workers dropped as dead
    staleness: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)

    def histogram(self) -> list[int]:
        top = max(self.staleness, default=-1)
        return [self.staleness.get(s, 0) for s in range(top + 1)]


LogFn = Callable[..., Any]


class ShardState:
    def __init__(self, shard: int, part: Partition, dense: torch.Tensor,
                 rows: torch.Tensor | None, rule: UpdateRule, consistency: Consistency,
                 workers: int, *, keep_backups: bool = False, log: LogFn | None = None,
                 pulls: PullDeltas | None = None) -> None:
        a, b = part.dense_range(shard)
        if dense.numel() != b - a:
            raise ValueError(f"shard {shard}: dense slice has {dense.numel()} != {b - a} values")
        self.shard, self.part, self.rule, self.consistency = shard, part, rule, consistency
        self.workers = workers
        self.dense = dense.detach().clone().reshape(-1)
        self.rows = rows.detach().clone() if rows is not None else None
        self.dense_state = rule.init([self.dense])
        self.rows_state = rule.init([self.rows]) if self.rows is not None else None
        self.keep_backups = keep_backups  # DC-ASGD: one copy of the weights per worker
        self.backups: dict[int, torch.Tensor] = {}
        self.version = 0
        self.clocks = [0] * workers
        self.active = set(range(workers))
        # (worker, flags, ids, the CRC-32 of its copy or None)
        self.parked: list[tuple[int, int, torch.Tensor | None, int | None]] = []
        self.buffer: list[Pending] = []
        self.stats = ShardStats()
        self.worker_stats: dict[int, list[torch.Tensor]] = {}
        self.lost_workers: dict[int, int] = {}  # dead worker -> its clock when dropped
        self._log = log
        self.pulls = pulls  # --compress: pulls answered with compressed deltas
        self.updater = Updater(f"shard{shard}-update")  # the dense update's thread
        self.noise_batch = 0  # BSP: samples behind one push; > 0 logs noise shares

    # ---- overlapping the update with the next receive (phalanx.ps.updater) ----------

    @contextlib.contextmanager
    def overlapped(self) -> Iterator[None]:
        """While inside, a large slice's update runs on a thread of its own, so the server
        loop receives the next message meanwhile; every value stays the in-line one."""
        with self.updater.overlapped():
            yield

    def settle(self) -> None:
        """Wait for the update in flight: after this the weights and the rule's state
        hold every applied push."""
        self.updater.settle()

    # ---- what the server loop needs to know ------------------------------------------

    @property
    def waiting(self) -> set[int]:
        """Workers whose pull this shard is holding back (they are silent by our doing)."""
        return {p[0] for p in self.parked}

    def reject_message(self, reason: str, push: bool = False) -> None:
        if push:
            self.stats.pushes_rejected += 1
        else:
            self.stats.messages_rejected += 1
        self.stats.reasons[reason] += 1
        if self._log is not None:
            self._log("reject", shard=self.shard, reason=reason)

    # ---- messages ----------------------------------------------------------------------

    def handle(self, worker: int, header: Header, tensors: list[torch.Tensor]) -> list[Outgoing]:
        """Process one message from ``worker``; return the replies it releases. The shard
        takes the message's tensors over (a transport allocated them for this message):
        a pushed gradient may be overwritten by its update."""
        if worker in self.lost_workers and header.shard == self.shard:
            return self._on_lost(worker, header)
        if not 0 <= worker < self.workers or worker not in self.active:
            self.reject_message("message from an unknown or finished worker")
            return []
        if header.shard != self.shard:
            self.reject_message("message addressed to another shard")
            return []
        if header.kind == Kind.PULL:
            return self._on_pull(worker, header, tensors)
        if header.kind == Kind.PUSH:
            return self._on_push(worker, header, tensors)
        if header.kind == Kind.PUSH_PULL:
            # exactly a PUSH followed by the worker's next PULL (dense, at clock seq + 1):
            # one message and one receive fewer per step
            out = self._on_push(worker, header, tensors)
            pull = Header(Kind.PULL, worker=worker, clock=header.seq + 1, shard=self.shard,
                          flags=WANT_DENSE)
            return out + self._on_pull(worker, pull, [])
        if header.kind == Kind.DONE:
            return self._on_done(worker, header, tensors)
        if header.kind == Kind.HEARTBEAT:
            return []  # liveness is the server loop's business
        self.reject_message(f"unexpected message kind {header.kind}")
        return []

    def _on_lost(self, w: int, h: Header) -> list[Outgoing]:
        """A message from a worker dropped as dead. Its restarted process (``--resume``
        of a run that had lost it) asks where it stands: it is told it stays out
        (ps/checkpoint.py says why). Its heartbeats until then are no error; anything else
        is (a dead worker sends nothing more)."""
        if h.kind == Kind.PULL and h.flags & RESUME:
            return [Outgoing(w, Header(Kind.LEFT, worker=w, clock=self.clocks[w],
                                       version=self.version, shard=self.shard), [])]
        if h.kind != Kind.HEARTBEAT:
            self.reject_message("message from a worker dropped as dead")
        return []

    def log_worker_lost(self, w: int, why: str) -> None:
        if self._log is not None:
            self._log("worker_lost", shard=self.shard, worker=w, clock=self.clocks[w],
                      version=self.version, reason=why)

    def drop_worker(self, w: int) -> list[Outgoing]:
        """``w`` is dead: stop expecting it. Its buffered pushes stay (they were good
        gradients); barriers and bounds now count the survivors, which may release them."""
        if w not in self.active:
            return []
        self.active.discard(w)
        self.lost_workers[w] = self.clocks[w]
        self.stats.workers_lost += 1
        self.parked = [p for p in self.parked if p[0] != w]
        if self.buffer and (not self.active or self.consistency.ready(
                [p.worker for p in self.buffer], self.active)):
            self._apply()
        return self._release()

    def _lost(self, w: int, upto: int) -> bool:
        """Pushes ``clocks[w] .. upto-1`` of ``w`` never arrived (a lossy link). Count them,
        end those iterations (a barrier must not wait for them). False: a bogus gap."""
        gap = upto - self.clocks[w]
        if gap <= 0:
            return True
        if gap > MAX_GAP:
            self.reject_message(f"sequence number {upto} too far ahead of {self.clocks[w]}")
            return False
        self.stats.pushes_lost += gap
        if self._log is not None:
            self._log("lost", shard=self.shard, worker=w, first=self.clocks[w], count=gap)
        self.buffer.append(Pending(w, upto - 1, self.version))  # counts for the barrier only
        self.clocks[w] = upto
        if self.consistency.ready([p.worker for p in self.buffer], self.active):
            self._apply()
        return True

    def _on_pull(self, w: int, h: Header, tensors: list[torch.Tensor]) -> list[Outgoing]:
        # a pull at clock c follows the worker's push c-1: a larger clock than ours means
        # pushes were lost; a smaller one is a restarted worker catching up (resume)
        if not h.flags & RESUME and not self._lost(w, h.clock):
            return []
        ids = crc = None
        if h.flags & CHECKED:
            check = tensors[-1] if tensors else None
            if check is None or check.dtype != torch.int64 or check.numel() != 1:
                self.reject_message("pull: the copy's checksum is not int64[1]")
                return []
            crc, tensors = int(check), tensors[:-1]
        if h.flags & HAS_ROWS:
            if len(tensors) != 1 or (bad := self._bad_ids(tensors[0])):
                self.reject_message(f"pull: {bad if tensors else 'no row ids'}")
                return []
            ids = tensors[0]
        self.parked.append((w, h.flags, ids, crc))
        return self._release()

    def _on_push(self, w: int, h: Header, tensors: list[torch.Tensor]) -> list[Outgoing]:
        if h.seq < self.clocks[w]:
            # already applied (or counted lost): e.g. a restarted worker resending
            self.stats.duplicates += 1
            return []
        if not self._lost(w, h.seq):
            return []
        if h.flags & SKIPPED:  # counted as the rejection it replaces (no payload to check)
            bad = ("the worker skipped a gradient holding NaN or inf" if not tensors
                   else "a skipped push carries a payload")
        else:
            tensors, bad = decode_push(h.flags, tensors, self.dense.numel())  # --compress
            bad = bad or self._bad_push(h, tensors)
        self.clocks[w] += 1  # even a rejected push ends the worker's iteration (no deadlock)
        if bad:
            self.reject_message(f"push: {bad}", push=True)
            self.buffer.append(Pending(w, h.seq, h.version))
        else:
            ids, rows = (tensors[1], tensors[2]) if h.flags & HAS_ROWS else (None, None)
            self.buffer.append(Pending(w, h.seq, h.version, tensors[0], ids, rows))
        if self.consistency.ready([p.worker for p in self.buffer], self.active):
            self._apply()
        return self._release()

    def _on_done(self, w: int, h: Header, tensors: list[torch.Tensor]) -> list[Outgoing]:
        self._lost(w, h.clock)  # its last pushes may have been lost on the way
        self.active.discard(w)
        self.worker_stats[w] = list(tensors)
        if self.buffer and (not self.active or self.consistency.ready(
                [p.worker for p in self.buffer], self.active)):
            self._apply()  # nobody else will push into this buffer: flush it
        return self._release()

    # ---- validation (everything in a message came from another process) ---------------

    def _bad_ids(self, ids: torch.Tensor) -> str:
        if self.rows is None:
            return "row ids sent to a model without a sparse table"
        if ids.dtype != torch.int64:
            return "row ids are not int64"
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.part.table.rows):
            return "row id out of range"
        if bool((self.part.owner(ids) != self.shard).any()):
            return "row id held by another shard"
        if ids.unique().numel() != ids.numel():
            return "repeated row id"
        return ""

    def _bad_push(self, h: Header, tensors: list[torch.Tensor]) -> str:
        if h.version > self.version:
            return f"version {h.version} is in the future (shard is at {self.version})"
        want = 3 if h.flags & HAS_ROWS else 1
        if len(tensors) != want:
            return f"{len(tensors)} payload tensors, expected {want}"
        g = tensors[0]
        if g.dtype != self.dense.dtype or g.numel() != self.dense.numel():
            return (f"dense gradient {g.dtype}[{g.numel()}] does not match the shard's "
                    f"{self.dense.dtype}[{self.dense.numel()}]")
        if not finite(g):
            return "NaN or Inf in the gradient"
        if want == 3:
            ids, rows = tensors[1], tensors[2]
            if bad := self._bad_ids(ids):
                return bad
            if rows.dtype != self.rows.dtype or rows.numel() != ids.numel() * self.rows.shape[1]:
                return "row gradients do not match the row ids"
            if not finite(rows):
                return "NaN or Inf in the row gradients"
        return ""

    # ---- applying updates --------------------------------------------------------------

    def _apply(self) -> None:
        batch = sorted(self.buffer, key=lambda p: (p.worker, p.clock))  # fixed summation order
        self.buffer = []
        valid = [p for p in batch if p.dense is not None]
        if not valid:
            return
        n = len(valid)
        staleness = [self.version - p.version for p in valid]
        # a batch (BSP, SoftSync) is scaled by its mean staleness, as in Zhang et al. 2016
        stale = math.ceil(sum(staleness) / n)
        self.settle()  # the previous update is in the weights and the rule's state
        # the received gradient (or the batch's new mean) is ours alone and read no more:
        # the rule may turn it into the update in place (no 4 MB allocation per push)
        grad = valid[0].dense if n == 1 else torch.stack([p.dense for p in valid]).mean(0)
        if self.noise_batch and n > 1 and self.version % noise_part.EVERY == 0 \
                and self._log is not None and len({p.version for p in valid}) == 1:
            small, big = noise_part.shares([p.dense for p in valid], grad)  # before the update
            self._log("noise_part", shard=self.shard, shards=self.part.shards,
                      version=self.version, small=small, big=big,
                      b_small=self.noise_batch, b_big=n * self.noise_batch)
        backup = None
        if self.keep_backups:
            backup = [torch.stack([self.backups.get(p.worker, self.dense) for p in valid]).mean(0)]
        self.updater.run(functools.partial(self._update_dense, grad, stale, backup),
                         self.dense.numel())
        if self.rows is not None:
            self._apply_rows(valid, stale)
        for p, s in zip(valid, staleness):
            self.stats.staleness[s] += 1
            if self._log is not None:
                self._log("apply", shard=self.shard, worker=p.worker, clock=p.clock,
                          version=self.version, staleness=s, batch=n)
        self.stats.pushes_applied += n
        self.stats.updates += 1
        self.version += 1

    def _update_dense(self, grad: torch.Tensor, stale: int,
                      backup: list[torch.Tensor] | None) -> None:
        updates, self.dense_state = update_owned(self.rule, [grad], self.dense_state,
                                                 [self.dense], staleness=stale, backup=backup)
        apply_updates([self.dense], updates)

    def _apply_rows(self, valid: list[Pending], stale: int) -> None:
        with_rows = [p for p in valid if p.ids is not None and p.ids.numel()]
        if not with_rows:
            return
        dim = self.rows.shape[1]
        ids = torch.cat([p.ids for p in with_rows])
        uniq, inverse = torch.unique(ids, return_inverse=True)
        grad = torch.zeros(len(uniq), dim, dtype=self.rows.dtype)
        grad.index_add_(0, inverse, torch.cat([p.rows.view(-1, dim) for p in with_rows]))
        grad /= len(valid)  # a row absent from a push had a zero gradient there
        local = self.part.local_index(uniq)
        n_local = self.rows.shape[0]
        # lazy sparse update: only the touched rows (and their optimizer state) move
        params = self.rows[local]
        state = gather_rows(self.rows_state, local, n_local)
        backup = [params] if self.keep_backups else None
        updates, state = self.rule.update([grad], state, [params], staleness=stale,
                                          backup=backup)
        self.rows[local] = params + updates[0]
        self.rows_state = scatter_rows(self.rows_state, state, local, n_local)

    def _release(self) -> list[Outgoing]:
        """Answer every parked pull the consistency model now admits."""
        if not self.parked:
            return []
        slowest = min((self.clocks[a] for a in self.active), default=math.inf)
        out, still = [], []
        for parked in self.parked:
            w, flags, ids, crc = parked
            if self.consistency.admits(self.clocks[w], slowest):
                out.append(self._params_reply(w, flags, ids, crc))
            else:
                still.append(parked)
        self.parked = still
        return out

    def _drifted(self, w: int, crc: int | None) -> bool:
        """The worker's copy is not the one we hold for it (a reply lost or mangled): it
        gets the full slice, and the counter says so."""
        if crc is None or self.pulls is None or self.pulls.matches(w, crc):
            return False
        self.stats.pull_resyncs += 1
        if self._log is not None:
            self._log("resync", shard=self.shard, worker=w, version=self.version)
        return True

    def _params_reply(self, w: int, flags: int, ids: torch.Tensor | None,
                      crc: int | None = None) -> Outgoing:
        # a snapshot, never the live tensor: the transport reads the payload after this
        # returns (gloo's isend), while the next push may already change the weights in
        # place; a torn read would mix two versions. The same copy is DC-ASGD's backup
        # (both only read it)
        want = bool(flags & WANT_DENSE)
        self.settle()  # the reply holds every push applied so far
        snapshot = self.dense.clone() if want or self.keep_backups else None
        dense = snapshot if want else self.dense[:0]
        if flags & CODEC_MASK:  # a compressed delta asked for: say in the reply if it is one
            flags &= ~(CODEC_MASK | CHECKED)
            if self.pulls is not None and want:
                fresh = bool(flags & RESUME) or self._drifted(w, crc)
                dense, codec = self.pulls.reply(w, snapshot, fresh=fresh)
                flags |= codec
        if self.keep_backups:
            # the weights the worker will hold: its decoded copy under compressed pulls
            held = self.pulls.held(w) if self.pulls is not None else None
            self.backups[w] = held.clone() if held is not None else snapshot
        tensors = [dense]
        if ids is not None:
            tensors.append(self.rows[self.part.local_index(ids)])
        header = Header(Kind.PARAMS, worker=w, clock=self.clocks[w], version=self.version,
                        shard=self.shard, flags=flags)
        return Outgoing(w, header, tensors)

