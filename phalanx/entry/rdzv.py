"""``torchrun --rdzv-backend phalanx``: torch's c10d rendezvous, with both of torchrun's
stores listening on one address instead of every interface.

torchrun's agent starts two ``TCPStore`` servers on the rendezvous host: the c10d
rendezvous store (``--rdzv-endpoint``'s port) and the store it shares with its workers
(``TORCHELASTIC_USE_AGENT_STORE``, a free port). torch creates both with
``TCPStore(host, port, is_master=True)``, and a ``TCPStore`` server binds the wildcard
(``::``, every interface) whatever ``host`` says; torch 2.13 has no flag to change it.
The one way in is ``master_listen_fd``: a socket bound by the caller. This backend is the
c10d one with that single change, registered with torchrun through the
``torchrun.handlers`` entry point (``pyproject.toml``), so the user only writes
``--rdzv-backend phalanx`` where they wrote ``c10d``:

* the rendezvous store listens on ``--rdzv-endpoint``'s address only (the endpoint must
  then be an address of the rendezvous host, as the other hosts reach it anyway);
* the shared agent store listens on ``--local-addr`` only (torchrun advertises that address
  to the workers as ``MASTER_ADDR``; without ``--local-addr`` it advertises the host name,
  which is then resolved and bound).

Everything else (membership, timeouts, ``--rdzv-conf``) is torch's own code, unchanged.
``--standalone`` always picks c10d (torchrun's choice); write ``--rdzv-backend phalanx
--rdzv-endpoint 127.0.0.1:0 --nnodes 1`` for a loopback-only single host.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
    C10dRendezvousBackend,
    _matches_machine_hostname,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    create_handler,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

DEFAULT_PORT = 29400  # c10d's


def bound_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``'s address (resolved once; IPv4 or IPv6), never the
    wildcard. ``port`` 0 takes a free one."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise RendezvousConnectionError(f"rendezvous address {host!r} does not resolve: "
                                        f"{e.strerror}") from None
    if addr[0] in ("0.0.0.0", "::"):
        raise RendezvousConnectionError(f"rendezvous address {host!r} is every interface; "
                                        "name one address of this host")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise RendezvousConnectionError(f"cannot listen on {host}:{port}: {e.strerror}") \
            from None
    sock.listen(128)
    return sock


def store_server(host: str, port: int, timeout: timedelta | None = None) -> TCPStore:
    """A multi-tenant ``TCPStore`` server listening on ``host`` only."""
    sock = bound_listener(host, port)
    kwargs = {"timeout": timeout} if timeout is not None else {}
    store = TCPStore(host, sock.getsockname()[1], is_master=True, multi_tenant=True,
                     master_listen_fd=sock.fileno(), **kwargs)
    sock.detach()  # the store owns (and closes) the descriptor now
    return store


class BoundBackend(C10dRendezvousBackend):
    """c10d's rendezvous state in the (bound) store, under this backend's name."""

    @property
    def name(self) -> str:
        return "phalanx"


class BoundRendezvousHandler(DynamicRendezvousHandler):
    """torch's dynamic rendezvous; the store it shares with the workers listens on this
    node's advertised address only."""

    def _create_tcp_store_server(self, master_addr, master_port) -> TCPStore:
        return store_server(master_addr, master_port)


def _rendezvous_store(params: RendezvousParameters) -> Store:
    """c10d's ``_create_tcp_store``, hosting on the endpoint's address only."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    cfg_is_host = params.get_as_bool("is_host")
    is_host = cfg_is_host if cfg_is_host is not None else _matches_machine_hostname(host)
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    timeout = timedelta(seconds=read_timeout)
    # as c10d: a guessed host that cannot host (another process of this rendezvous on this
    # machine already does) joins as a client
    for is_server in (is_host, False):
        try:
            if is_server:
                return store_server(host, port, timeout)
            return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
        except (ValueError, RuntimeError, TimeoutError, RendezvousConnectionError) as exc:
            if not is_server or cfg_is_host is not None:
                raise RendezvousConnectionError(
                    f"the rendezvous store at {host}:{port} failed: {exc}") from exc
    raise AssertionError("unreachable")


def create_bound_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The ``phalanx`` rendezvous handler (torch's ``_create_c10d_handler`` with both stores
    bound)."""
    store = _rendezvous_store(params)
    backend = BoundBackend(store, params.run_id)
    handler = create_handler(store, backend, params)
    handler.__class__ = BoundRendezvousHandler  # the same object, one method bound
    return handler


def handler():
    """The ``torchrun.handlers`` entry point: torch calls it and registers what it returns."""
    return create_bound_handler
