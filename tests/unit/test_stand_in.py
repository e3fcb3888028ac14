"""When a stand-in may take a dead rank's place in the rendezvous (runtime/launch.py): only
while no peer can have read the dead rank's address (gloo's keys are PREFIX/RANK, and a
peer reads others' keys only after writing its own)."""

import datetime

import torch.distributed as dist

from phalanx.runtime.launch import _published
from phalanx.runtime.supervise import peer_lost


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
