"""The dashboard's web application (Starlette, an ASGI framework, served by uvicorn).

GET only: the page and its assets (``static/``, a fixed list), a JSON API over the folder
(``/api/index``, ``/api/run``, ``/api/schedule``), the folder's own files read-only
(``/files/PATH``: a fixed list of text and image kinds) and ``/api/stream``, server-sent
events that say when anything the page shows changed. Every path a request names goes
through :func:`safe_path.inside`; an unexpected error is one line of JSON, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route

from phalanx.dashboard.safe_path import Refused, inside
from phalanx.dashboard.scan import Folder

STATIC = Path(__file__).parent / "static"
ASSETS = {"app.js": "text/javascript", "schedule.js": "text/javascript", "style.css": "text/css",
          "uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css",
          "LICENSE-uPlot.txt": "text/plain"}
RAW = {".json": "application/json", ".jsonl": "text/plain", ".csv": "text/plain",
       ".md": "text/plain", ".log": "text/plain", ".txt": "text/plain",
       ".yaml": "text/plain", ".png": "image/png"}
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store",
           "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; object-src 'none'"}
WATCH_S = 0.5


def _json(obj: Any, status: int = 200) -> Response:
    body = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    return Response(body, status, media_type="application/json", headers=HEADERS)


def _error(status: int, why: str) -> Response:
    return _json({"error": why}, status)


class Watcher:
    """One thread for every open page: rescans the folder every ``WATCH_S`` while a page
    listens and bumps ``version`` when anything changed."""

    def __init__(self, folder: Folder) -> None:
        self.folder, self.version, self.listeners = folder, 0, 0
        self._cond = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last: Any = None

    def attach(self) -> None:
        with self._cond:
            self.listeners += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="dashboard-watch",
                                                daemon=True)
                self._thread.start()

    def detach(self) -> None:
        with self._cond:
            self.listeners -= 1

    def _loop(self) -> None:
        while self.listeners > 0:
            try:
                sig = self.folder.signature()
            except Exception:  # noqa: BLE001 - a folder that vanished mid-scan: try again
                sig = None
            if sig != self._last:
                self._last, self.version = sig, self.version + 1
            time.sleep(WATCH_S)


def build_app(root: Path, allowed_hosts: list[str]) -> Starlette:
    folder = Folder(root)
    watcher = Watcher(folder)
    # read the folder once now, so that the first page does not wait for 1,000 runs' files
    threading.Thread(target=folder.index, name="dashboard-warm", daemon=True).start()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return _error(404, f"no asset {name!r}")
        return FileResponse(STATIC / name, media_type=ASSETS[name], headers=HEADERS)

    async def index(request: Request) -> Response:
        return _json(await asyncio.to_thread(folder.index))

    async def run(request: Request) -> Response:
        rid = request.query_params.get("id", "")
        try:
            inside(folder.root, rid)
            since = (int(request.query_params.get("train", 0)),
                     int(request.query_params.get("eval", 0)))
        except Refused as e:
            return _error(400, f"id {rid!r}: {e}")
        except ValueError:
            return _error(400, "train and eval must be whole numbers")

        def read() -> dict[str, Any] | None:
            r = folder.run(rid)
            return None if r is None else {"row": folder.row(r), **r.curves(*since)}
        out = await asyncio.to_thread(read)
        return _error(404, f"no run {rid!r} in the folder") if out is None else _json(out)

    async def schedule(request: Request) -> Response:
        sid = request.query_params.get("id", "")
        try:
            inside(folder.root, sid.split("#", 1)[0])
        except Refused as e:
            return _error(400, f"id {sid!r}: {e}")
        only_jct = request.query_params.get("only") == "jct"
        out = await asyncio.to_thread(folder.schedule_json, sid, only_jct)
        if out is None:
            return _error(404, f"no schedule {sid!r} in the folder")
        return Response(out, media_type="application/json", headers=HEADERS)

    async def files(request: Request) -> Response:
        rel = request.path_params["path"]
        try:
            path = inside(folder.root, rel)
        except Refused as e:
            return _error(400, f"/files/{rel}: {e}")
        if path.suffix not in RAW or not path.is_file():
            return _error(404, f"/files/{rel}: not a file the dashboard shows")
        return FileResponse(path, media_type=RAW[path.suffix], headers=HEADERS)

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            watcher.attach()
            try:
                seen, beat = -1, time.monotonic()
                yield "retry: 2000\n\n"
                while not await request.is_disconnected():
                    if watcher.version != seen:
                        seen = watcher.version
                        yield f"data: {seen}\n\n"
                    elif time.monotonic() - beat > 15:
                        beat = time.monotonic()
                        yield ": still here\n\n"
                    await asyncio.sleep(0.2)
            finally:
                watcher.detach()
        return StreamingResponse(events(), media_type="text/event-stream", headers=HEADERS)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == 405:
            return _error(405, f"{request.method} {request.url.path}: the dashboard is "
                               "read-only (GET only)")
        return _error(status, f"{request.url.path}: not found")

    async def failed(request: Request, exc: Exception) -> Response:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return _error(503, f"could not read the folder: {why}")

    async def favicon(request: Request) -> Response:
        return Response(status_code=204, headers=HEADERS)  # none: a browser asks anyway

    routes = [Route("/", page), Route("/favicon.ico", favicon), Route("/static/{name}", asset),
              Route("/api/index", index), Route("/api/run", run), Route("/api/schedule", schedule),
              Route("/api/stream", stream), Route("/files/{path:path}", files)]
    return Starlette(routes=routes,
                     middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)],
                     exception_handlers={404: not_found, 405: not_found, Exception: failed})
