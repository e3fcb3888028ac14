"""When a stand-in may take a dead rank's place in the rendezvous (runtime/launch.py): only
while no peer can have read the dead rank's address (gloo's keys are PREFIX/RANK, and a
peer reads others' keys only after writing its own)."""

import datetime

import torch.distributed as dist

from phalanx.runtime.launch import _published


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
