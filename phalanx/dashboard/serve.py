"""Serving the page: the socket is bound here (so a port in use or a bad address is one
line, and port 0 names the port it got), then uvicorn serves the app on it, in the
foreground (``phalanx dashboard``) or on a thread beside a live schedule."""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.errors import ConfigError

if TYPE_CHECKING:
    import uvicorn

LOCAL = ("127.0.0.1", "localhost", "::1")


def check_host(host: str) -> str:
    if host == "localhost":
        return host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"--host {host}: not an IP address (e.g. 127.0.0.1, the "
                          "default, or this machine's address on a network)") from None
    if address.is_unspecified:  # the house rule: never every interface
        raise ConfigError(f"--host {host}: phalanx never serves on every interface; name "
                          "this machine's address on the network that should see the page")
    return str(address)


def check_port(port: int, flag: str = "--port") -> int:
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag} {port}: must be 0..65535 (0: any free port)")
    return port


def check_folder(folder: str) -> Path:
    p = Path(folder)
    if not p.is_dir():
        why = "does not exist" if not p.exists() else "is not a folder"
        raise ConfigError(f"dashboard DIR {folder}: {why}")
    return p.resolve()


def bind(host: str, port: int, flag: str = "--port") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"{flag} {port}: cannot listen on {host}:{port} "
                          f"({e.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


@dataclass
class Served:
    """A dashboard being served: its address, and how to stop it."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread | None = None

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=5)


def _hosts(host: str) -> list[str]:
    return sorted({host, *LOCAL, f"[{host}]"})


def make(root: Path, host: str, sock: socket.socket) -> Served:
    # imported here: every `phalanx` command (and each fork server) imports this module
    # through the command's parser; the web stack costs ~0.15 s only when it serves
    import uvicorn

    from phalanx.dashboard.app import build_app

    app = build_app(root, _hosts(host))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=1)
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return Served(f"http://{shown}:{port}/", uvicorn.Server(config))


def serve_forever(root: Path, host: str, port: int) -> None:
    sock = bind(host, port)
    served = make(root, host, sock)
    print(f"phalanx dashboard: serving {root} read-only at {served.url} (Ctrl-C stops)",
          flush=True)
    served.server.run(sockets=[sock])


def serve_in_thread(root: Path, host: str, port: int, flag: str) -> Served:
    sock = bind(host, port, flag)
    served = make(root, host, sock)
    served.thread = threading.Thread(target=served.server.run, kwargs={"sockets": [sock]},
                                     name="dashboard", daemon=True)
    served.thread.start()
    return served
