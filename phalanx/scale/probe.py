"""The link probe ``phalanx scale calibrate`` runs inside two test hosts: a TCP server that
answers each message with one byte once it has all of it, and a client that times
message + answer for each size (one connection, a pause between messages as a training step's
compute leaves one). Plain sockets: no torch, so a probe starts in ~0.1 s.

    python -m phalanx.scale.probe server PORT
    python -m phalanx.scale.probe client ADDR PORT SIZES REPEATS GAP_S   (prints JSON)
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bool:
    while n:
        got = conn.recv(min(n, CHUNK))
        if not got:
            return False
        n -= len(got)
    return True


def serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                head = conn.recv(8, socket.MSG_WAITALL)
                if len(head) < 8:
                    return
                size = int.from_bytes(head, "big")
                if size == 0 or not _recv_exact(conn, size):
                    return
                conn.sendall(b"k")


def client(addr: str, port: int, sizes: list[int], repeats: int, gap: float) -> list[dict]:
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
                sock.sendall(size.to_bytes(8, "big") + payload)
                if sock.recv(1) != b"k":
                    raise SystemExit("probe: the server closed the connection")
                dt = time.perf_counter() - t0
                if rep:  # the first message of a size warms the connection up
                    rows.append({"bytes": size, "seconds": dt})
        sock.sendall((0).to_bytes(8, "big"))
    return rows


def main(argv: list[str]) -> None:
    if argv[:1] == ["server"]:
        serve(int(argv[1]))
    elif argv[:1] == ["client"]:
        sizes = [int(v) for v in argv[3].split(",")]
        print(json.dumps(client(argv[1], int(argv[2]), sizes, int(argv[4]), float(argv[5]))))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
