"""When a stand-in may take a dead rank's place in the rendezvous (runtime/launch.py): only
while no peer can have read the dead rank's address (gloo's keys are PREFIX/RANK, and a
peer reads others' keys only after writing its own)."""

import datetime
import signal

import torch.distributed as dist

from phalanx.runtime import exits
from phalanx.runtime.launch import _published
from phalanx.runtime.supervise import UP_FILE, _survived, peer_lost


def test_a_stand_in_comes_too_late_only_once_a_peer_may_have_read_the_dead_rank() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    assert not _published(store, 2, 3)  # nobody wrote anything yet
    store.set("0//cpu//0/0", b"addr0")
    assert not _published(store, 2, 3)  # a peer waits for rank 2's key: a stand-in sets it
    store.set("0//cpu//0/2", b"addr2")
    assert _published(store, 2, 3)  # rank 0 may have read the dead rank's address
    assert not _published(store, 1, 3)  # rank 1 never wrote its key
    store.set("other/7", b"x")  # a key under another prefix, a rank beyond the world
    assert not _published(store, 1, 3)


def test_a_peer_s_lost_connection_is_the_driver_s_to_report() -> None:
    """A rank whose collective lost its peer prints no traceback (the driver names the dead
    peer in one line): gloo's messages, as a sync run's rank 0 raised them in CI."""
    assert peer_lost(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:9453. This is typically caused by a remote worker "
        "crashing.")
    assert peer_lost("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                     "tcp/pair.cc:537] Read error [127.0.0.1]:1953: Connection reset by peer.")
    assert not peer_lost("ValueError: shapes (3,) and (4,) differ")
    assert not peer_lost("Timed out waiting 30000ms for recv operation")


def test_the_group_formed_only_once_every_rank_got_past_the_rendezvous(tmp_path) -> None:
    """A worker killed after its own rendezvous returned while a peer's was still connecting
    to it failed that peer's ("Gloo connectFullMesh failed ... Connection closed by peer":
    a CI failure, after the driver had said the run goes on without it). Its death counts
    as after the group formed only once every rank's UP file is there; before, a stand-in
    is asked for (here none can come: the run ends)."""
    asked = []

    def stand_in(rank):
        asked.append(rank)
        return None  # its address was published: too late for a stand-in

    def survived():
        return _survived(2, -signal.SIGKILL, str(tmp_path), 3, lambda r: r >= 1, stand_in,
                         "worker 1")
    (tmp_path / UP_FILE.format(rank=2)).touch()  # the victim's side returned
    (tmp_path / UP_FILE.format(rank=0)).touch()
    assert survived() == (False, None) and asked == [2]  # rank 1 still connecting: ends
    (tmp_path / UP_FILE.format(rank=1)).touch()
    went_on, death = survived()
    assert went_on is True and asked == [2]  # formed: no stand-in asked for
    assert (death.rank, death.exit_code, death.how) == (2, -signal.SIGKILL, exits.DIED)
