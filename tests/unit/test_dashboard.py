"""The dashboard's readers and server without a browser: paths outside the folder refused,
half-written and corrupt files reported (never raised), a run's status from its lock, the
command's one-line errors, and the server's read-only HTTP surface."""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import socket
import time
from pathlib import Path

import pytest

from phalanx.dashboard.__main__ import main as dashboard_main
from phalanx.dashboard.jsonl_tail import JsonlTail
from phalanx.dashboard.safe_path import Refused, inside
from phalanx.dashboard.scan import Folder
from phalanx.dashboard.serve import serve_in_thread


def test_paths_outside_the_folder_are_refused(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    (root / "a").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert inside(root, "a") == root / "a" and inside(root, "") == root
    for bad in ("/etc", "../x", "a/../../x", "a/..", "~root", "out", "out/a", "a\\..\\x",
                "a\x00"):
        with pytest.raises(Refused):
            inside(root, bad)


def test_jsonl_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    p.write_text('{"kind": "start"}\n{"kind": "tr')
    t = JsonlTail(p)
    assert t.read_new() == [{"kind": "start"}] and t.unfinished_line
    with p.open("a") as f:
        f.write('ain", "step": 10}\nnot json\n[1]\n')
    assert t.read_new() == [{"kind": "train", "step": 10}]
    assert t.bad == [3, 4] and not t.unfinished_line and t.read_new() == []
    p.write_text('{"kind": "eval"}\n')  # replaced (a run started again with --overwrite)
    assert t.read_new() == [{"kind": "eval"}] and t.bad == []


def _run(folder: Path, summary: str | None, events: str) -> None:
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text(events)
    if summary is not None:
        (folder / "summary.json").write_text(summary)


START = '{"kind": "start", "unix": 100, "strategy": "sync", "model": "mlp", "data": "x"}\n'
TRAIN = '{"kind": "train", "rank": 0, "unix": 101, "step": 10, "samples": 64, "loss": 2.0}\n'


def test_runs_status_figures_and_problems(tmp_path: Path) -> None:
    _run(tmp_path / "done", '{"test_loss": 1.5, "test_accuracy": 0.7, "samples_per_s": 9}',
         START + TRAIN)
    _run(tmp_path / "cut", '{"test_lo', START + TRAIN + "garbage\n" + '{"kind": "tra')
    _run(tmp_path / "stopped", None, START + TRAIN)
    (tmp_path / "stopped" / "checkpoint.pt").write_bytes(b"")
    _run(tmp_path / "live", None, START + TRAIN)
    lock = open(tmp_path / "live" / ".phalanx.lock", "ab")  # noqa: SIM115 - held below
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # as phalanx train holds it
    try:
        rows = {r["id"]: r for r in Folder(tmp_path).index()["runs"]}
    finally:
        lock.close()
    assert {k: r["status"] for k, r in rows.items()} == {
        "done": "finished", "cut": "failed", "stopped": "stopped", "live": "running"}
    done = rows["done"]
    assert (done["strategy"], done["test_loss"], done["test_accuracy"], done["samples_per_s"]
            ) == ("sync", 1.5, 0.7, 9.0) and done["problems"] == []
    assert rows["cut"]["problems"] == [
        "summary.json is half-written or corrupt (not JSON)",
        "events.jsonl: line(s) 3 not JSON (corrupt)",
        "events.jsonl ends mid-line (still being written, or truncated)"]


def test_schedules_read_live_state_csv_and_corrupt_files(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    state = {"format": "phalanx-schedule-state", "version": 1, "clock": 12.5,
             "cluster": ["s0:2"], "queue": ["b"], "pending": ["c"], "finished": False,
             "jobs": {"a": {"status": "running", "gpus": 1, "folder": "", "fields": {
                 "start": 1.0, "end": -1, "placements": [[1.0, [1]]], "preemptions": 0,
                 "restarts": 0, "failure": "", "executed": 3}},
                 "b": {"status": "waiting", "gpus": 1, "folder": "", "fields": {
                     "start": 2.0, "end": -1, "placements": [[2.0, [0]]],
                     "preemptions": 1, "restarts": 0, "failure": "", "executed": 1}}}}
    (live / "scheduler-state.json").write_text(json.dumps(state))
    (live / "dashboard-jobs.json").write_text('{"a": 0.5, "b": 1.0, "c": 30}')
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "summary.json").write_text('{"ordering": "fifo", "cluster": "uniform-1x1x2x4"}')
    (sim / "jobs.csv").write_text(
        "id,name,vc,model,gpus,submit,start,end,jct,queue_delay,executed,preemptions,status,"
        "placements,preemptible\n0,j0,v,m,2,0.0,1.0,11.0,11.0,1.0,10.0,1,finished,"
        "\"1.0@0,1;5.0@2,3\",yes\n1,j1,v,m,1,0.5")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "scheduler-state.json").write_text("{")
    f = Folder(tmp_path)
    rows = {r["id"]: r for r in f.index()["schedules"]}
    assert rows["live"]["status"] == "live" and rows["live"]["running"] == 1
    assert rows["bad"]["problems"] == ["scheduler-state.json is half-written or corrupt "
                                       "(not JSON)"]
    assert rows["sim"]["problems"] == ["jobs.csv: 1 row(s) malformed (half-written?), skipped"]
    d = f.schedule("live")
    assert d["jobs"]["name"] == ["a", "b", "c"]
    assert d["jobs"]["status"] == ["running", "waiting", "not arrived"]
    assert d["cluster"]["devices"] == 2 and d["clock"] == 12.5 and d["queue"] == ["b"]
    assert d["lost"] == []  # a state without the field (written before it existed)
    assert d["jobs"]["stops"] == [[], [], []]
    state["jobs"]["b"]["fields"]["stops"] = [1.5, "x"]
    (live / "scheduler-state.json").write_text(json.dumps(state))
    assert Folder(tmp_path).schedule("live")["jobs"]["stops"][1] == [1.5]
    state["lost"] = ["s0", 3, None]  # the lost servers the scheduler saved; junk dropped
    (live / "scheduler-state.json").write_text(json.dumps(state))
    assert Folder(tmp_path).schedule("live")["lost"] == ["s0"]
    s = f.schedule("sim")
    assert s["jobs"]["placements"] == [[[1.0, [0, 1]], [5.0, [2, 3]]]]
    assert s["jobs"]["stops"] == [[]]  # a jobs.csv written before stops were recorded
    assert s["cluster"]["devices"] == 8 and len(s["cluster"]["zones"][0]["racks"]) == 1


@pytest.mark.parametrize(("args", "error"), [
    (["/no/such/folder"], "dashboard DIR /no/such/folder: does not exist"),
    ([".", "--port", "70000"], "--port 70000: must be 0..65535 (0: any free port)"),
    ([".", "--host", "example.com"], "--host example.com: not an IP address"),
])
def test_bad_input_is_one_line(args: list[str], error: str, capsys) -> None:
    assert dashboard_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"phalanx: error: {error}") and err.count("\n") == 1


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert dashboard_main([str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in err and err.count("\n") == 1


def _request(port: int, method: str, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", f"{host}:{port}")
    conn.endheaders()
    r = conn.getresponse()
    return r.status, r.read().decode()


def test_the_server_is_read_only_and_local(tmp_path: Path) -> None:
    _run(tmp_path / "r", '{"test_loss": 1}', START)
    (tmp_path.parent / "outside.json").write_text("{}")
    served = serve_in_thread(tmp_path, "127.0.0.1", 0, "--port")
    port = int(served.url.rsplit(":", 1)[1].strip("/"))
    try:
        assert _request(port, "GET", "/files/r/summary.json") == (200, '{"test_loss": 1}')
        assert _request(port, "GET", "/files/../outside.json")[0] == 400
        assert _request(port, "GET", f"/files/{tmp_path.parent}/outside.json")[0] == 400
        assert _request(port, "GET", "/files/r/events.jsonl")[0] == 200
        assert _request(port, "GET", "/files/r/.phalanx.lock")[0] == 404
        status, body = _request(port, "POST", "/api/index")
        assert status == 405 and "read-only" in body
        assert _request(port, "GET", "/", host="attacker.example")[0] == 400  # rebinding
        status, body = _request(port, "GET", "/api/run?id=r")
        assert status == 200 and json.loads(body)["row"]["status"] == "finished"
        assert _request(port, "GET", "/api/run?id=nope")[0] == 404
        assert _request(port, "GET", "/static/app.py")[0] == 404
    finally:
        served.stop()


def test_schedule_dashboard_port_is_checked_first(tmp_path: Path, capsys) -> None:
    from phalanx.cli import main

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: a, arrival: 0, gpus: 1, config: {model: mlp}}\n")
    assert main(["schedule", "--jobs", str(jobs), "--dashboard", "70000",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "phalanx: error: --dashboard 70000: must be 0..65535 (0: any free port)\n"
    assert not (tmp_path / "o").exists()


def test_nan_and_infinity_are_read_as_null(tmp_path: Path) -> None:
    """Python writes NaN where JSON has none: the page gets null, never invalid JSON."""
    _run(tmp_path / "r", '{"test_loss": NaN, "samples_per_s": Infinity, "model": "mlp"}',
         START + TRAIN.replace('"loss": 2.0', '"loss": NaN'))
    f = Folder(tmp_path)
    row = f.index()["runs"][0]
    assert (row["test_loss"], row["samples_per_s"], row["model"]) == (None, None, "mlp")
    assert f.run("r").curves()["train"][0][3] is None
    json.dumps(f.index(), allow_nan=False)


def test_a_live_schedules_running_job_is_a_running_run(tmp_path: Path) -> None:
    """Its ranks hold no run lock: the schedule's state says whether it runs."""
    state = {"format": "phalanx-schedule-state", "version": 1, "clock": 3.0,
             "cluster": ["s0:2"], "queue": ["b"], "pending": [], "finished": False,
             "jobs": {n: {"status": st, "gpus": 1, "folder": "", "fields": {
                 "start": 1.0, "end": -1, "placements": [[1.0, [i]]], "preemptions": 0,
                 "restarts": 0, "failure": "", "executed": 1}}
                 for i, (n, st) in enumerate([("a", "running"), ("b", "waiting")])}}
    (tmp_path / "scheduler-state.json").write_text(json.dumps(state))
    for n in "ab":
        _run(tmp_path / "jobs" / n, None, START + TRAIN)
        (tmp_path / "jobs" / n / "checkpoint.pt").write_bytes(b"")
    rows = {r["id"]: r["status"] for r in Folder(tmp_path).index()["runs"]}
    assert rows == {"jobs/a": "running", "jobs/b": "stopped"}
    state["finished"] = True
    (tmp_path / "scheduler-state.json").write_text(json.dumps(state))
    rows = {r["id"]: r["status"] for r in Folder(tmp_path).index()["runs"]}
    assert rows == {"jobs/a": "stopped", "jobs/b": "stopped"}


def test_a_dead_schedulers_state_is_shown_stopped(tmp_path: Path) -> None:
    """A running scheduler saves its state at least every second; an old unfinished one
    is a scheduler that died, not a live schedule."""
    state = {"format": "phalanx-schedule-state", "version": 1, "clock": 3.0,
             "cluster": ["s0:1"], "queue": [], "pending": [], "finished": False, "jobs": {}}
    path = tmp_path / "scheduler-state.json"
    path.write_text(json.dumps(state))
    f = Folder(tmp_path)
    assert f.index()["schedules"][0]["status"] == "live"
    old = time.time() - 60
    os.utime(path, (old, old))
    row = f.index()["schedules"][0]
    assert row["status"] == "stopped"
    assert row["problems"][0].startswith("scheduler-state.json last saved 60 s ago")


def test_every_interface_is_refused_in_one_line():
    """The house rule: 127.0.0.1 unless an address is named, never every interface."""
    from phalanx.dashboard.serve import check_host
    from phalanx.errors import ConfigError

    assert check_host("127.0.0.1") == "127.0.0.1" and check_host("10.231.0.2") == "10.231.0.2"
    for host in ("0.0.0.0", "::"):
        with pytest.raises(ConfigError, match="never serves on every interface"):
            check_host(host)


def test_stop_times_are_read_from_jobs_csv() -> None:
    from phalanx.dashboard.schedules import parse_times

    assert parse_times("4.0;12.5") == [4.0, 12.5]
    assert parse_times("") == [] and parse_times("4.0;x;;7") == [4.0, 7.0]
