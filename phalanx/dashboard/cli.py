"""``phalanx dashboard DIR [--port P] [--host H]``: the read-only page over DIR."""

from __future__ import annotations

import argparse

from phalanx.dashboard.serve import check_folder, check_host, check_port, serve_forever

DEFAULT_PORT = 8265


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="a read-only web page over a folder of runs and "
                                         "schedules (live: it follows them as they grow)")
    add_flags(p)


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="the folder to show: runs (events.jsonl, "
                   "summary.json) and schedules (scheduler-state.json, jobs.csv) anywhere "
                   "under it")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to serve on (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                        "every interface, 0.0.0.0, is refused)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = check_folder(args.dir)
    host = check_host(args.host)
    serve_forever(root, host, check_port(args.port))
    return 0
