"""The link probe ``phalanx scale calibrate`` runs inside two test hosts: a TCP server that
answers each message with one byte once it has all of it, and a client that times
message + answer for each size (one connection, a pause between messages as a training step's
compute leaves one). ``duplex``: the server sends as many bytes back while it receives (a
ring step's two directions at once). Plain sockets: no torch, so a probe starts in ~0.1 s.

    python -m phalanx.scale.probe server ADDR PORT   (listens on ADDR only)
    python -m phalanx.scale.probe client ADDR PORT SIZES REPEATS GAP_S [duplex]  (JSON)
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bool:
    while n:
        got = conn.recv(min(n, CHUNK))
        if not got:
            return False
        n -= len(got)
    return True


def serve(addr: str, port: int) -> None:
    with socket.create_server((addr, port)) as srv:  # the host's own address, never all
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                head = conn.recv(8, socket.MSG_WAITALL)
                if len(head) < 8:
                    return
                size, duplex = int.from_bytes(head[:7], "big"), head[7]
                if size == 0:
                    return
                sender = None
                if duplex:  # send as many bytes back while receiving
                    sender = threading.Thread(target=conn.sendall, args=(b"\0" * size,))
                    sender.start()
                if not _recv_exact(conn, size):
                    return
                if sender is not None:
                    sender.join()
                conn.sendall(b"k")


def client(addr: str, port: int, sizes: list[int], repeats: int, gap: float,
           duplex: bool = False) -> list[dict]:
    for _ in range(50):  # the server starts in another process: retry for up to 5 s
        try:
            sock = socket.create_connection((addr, port), timeout=60)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"probe: cannot connect to {addr}:{port}")
    rows = []
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for size in sizes:
            payload = b"\0" * size
            for rep in range(repeats + 1):
                time.sleep(gap)
                t0 = time.perf_counter()
                head = size.to_bytes(7, "big") + bytes([int(duplex)])
                if duplex:
                    sender = threading.Thread(target=sock.sendall, args=(head + payload,))
                    sender.start()
                    if not _recv_exact(sock, size):
                        raise SystemExit("probe: the server closed the connection")
                    sender.join()
                else:
                    sock.sendall(head + payload)
                if sock.recv(1) != b"k":
                    raise SystemExit("probe: the server closed the connection")
                dt = time.perf_counter() - t0
                if rep:  # the first message of a size warms the connection up
                    rows.append({"bytes": size, "seconds": dt})
        sock.sendall((0).to_bytes(8, "big"))
    return rows


def main(argv: list[str]) -> None:
    if argv[:1] == ["server"]:
        serve(argv[1], int(argv[2]))
    elif argv[:1] == ["client"]:
        sizes = [int(v) for v in argv[3].split(",")]
        duplex = argv[6:7] == ["duplex"]
        print(json.dumps(client(argv[1], int(argv[2]), sizes, int(argv[4]), float(argv[5]),
                                duplex)))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
