"""The dashboard in a real headless browser (Debian's chromium + chromium-driver, Selenium):
real runs, a real simulation and a real live schedule, one browser for the module.

What a person would check: the runs table lists a finished run with its figures; a
training run's curve gains points without a reload; `phalanx schedule --dashboard` shows a
job's device change colour when it is placed and again when it is preempted; two
simulated schedules' JCT distributions are drawn; `/../` and absolute paths are refused;
bad files are shown as such; and the browser console shows no error anywhere."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.cli import main
from phalanx.dashboard.headless import browser, console_errors, missing, wait_ready

pytestmark = pytest.mark.skipif(bool(missing()), reason=missing() or "browser present")
PY = sys.executable


def start(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([PY, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)


def url_of(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The http://127.0.0.1:PORT/ a dashboard prints (the line is read as it comes)."""
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        if m:
            return m.group(1)
    raise AssertionError("no dashboard URL printed:\n" + "".join(seen))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run, two simulated schedules (fifo and las on one trace) and bad files."""
    root = tmp_path_factory.mktemp("dash")
    # in this process: the command's own code, without a second import of torch
    assert main(["train", "--model", "mlp", "--data", "synthetic", "--strategy", "single",
                 "--max-steps", "40", "--no-progress", "--out", str(root / "runs" / "done")]) == 0
    assert main(["simulate", "--trace", "synthetic:jobs=80,rate=200,median=900,max_gpus=4",
                 "--cluster", "uniform:1,1,2,4", "--compare", "fifo,las", "--no-progress",
                 "--out", str(root / "sims" / "cmp")]) == 0
    bad = root / "runs" / "cut"   # a run cut mid-line with a corrupt summary
    bad.mkdir()
    done = (root / "runs" / "done" / "events.jsonl").read_text()
    (bad / "events.jsonl").write_text(done[: len(done) // 2] + "{not json}\n" + '{"kind": "tr')
    (bad / "summary.json").write_text('{"test_loss": 0.')
    broken = root / "sims" / "broken"
    broken.mkdir()
    (broken / "scheduler-state.json").write_text('{"format": "phalanx-schedule-st')
    # a live schedule that ended with server s1 lost, its job held there (the fields as
    # cluster/live/state.py writes them)
    lost = root / "sims" / "lost"
    lost.mkdir()
    fields = {"start": 1.0, "end": -1, "placements": [[1.0, [2, 3]]], "preemptions": 0,
              "restarts": 0, "failure": "", "executed": 3}
    (lost / "scheduler-state.json").write_text(json.dumps({
        "format": "phalanx-schedule-state", "version": 1, "clock": 9.0, "finished": True,
        "cluster": ["s0:2", "s1:2"], "queue": [], "pending": [], "lost": ["s1"],
        "jobs": {"a": {"status": "running", "gpus": 2, "folder": "", "fields": fields}}}))
    return root


@pytest.fixture(scope="module")
def page(folder: Path):
    server = start("-m", "phalanx.dashboard", str(folder), "--port", "0")
    try:
        url = url_of(server)
        with browser() as driver:
            yield driver, url
    finally:
        stop(server)


def show(driver, url: str, fragment: str) -> None:
    driver.get(url + "#" + fragment)
    driver.refresh()  # a new fragment alone is not a load
    wait_ready(driver, timeout=30)  # a loaded 2-core machine: seconds, not the usual 0.5


def until(fn, timeout: float = 30.0, what: str = ""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def read_row(driver, selector: str) -> dict[str, str] | None:
    """A table row's status, text and cells in one read: the page redraws its tables as
    the folder changes, so an element held across two reads can go stale (CI saw it)."""
    return driver.execute_script(
        "const r = document.querySelector(arguments[0]); if (!r) return null;"
        "const o = {status: r.dataset.status || '', text: r.innerText};"
        "r.querySelectorAll('td[data-col]').forEach(td => o[td.dataset.col] = td.innerText);"
        "return o", selector)


def test_runs_table_lists_a_finished_run_with_its_figures(page, folder: Path) -> None:
    driver, url = page
    show(driver, url, "runs")
    summary = json.loads((folder / "runs" / "done" / "summary.json").read_text())
    row = until(lambda: read_row(driver, 'tr[data-run="runs/done"]'), what="the run's row")
    assert row["status"] == "finished"
    assert row["strategy"] == "single" and row["model"] == "mlp"
    assert float(row["test_accuracy"]) == pytest.approx(summary["test_accuracy"], abs=1e-4)
    assert float(row["test_loss"]) == pytest.approx(summary["test_loss"], rel=1e-2)
    assert float(row["samples_per_s"].replace(",", "")) == pytest.approx(
        summary["samples_per_s"], rel=1e-3)
    # the cut run is listed with what is wrong with it, not a 500
    cut = until(lambda: read_row(driver, 'tr[data-run="runs/cut"]'), what="the cut run")["text"]
    assert "summary.json is half-written or corrupt" in cut and "not JSON" in cut
    assert "ends mid-line" in cut
    show(driver, url, "schedules")
    broken = until(lambda: read_row(driver, 'tr[data-schedule="sims/broken"]'),
                   what="the broken schedule")["text"]
    assert "scheduler-state.json is half-written or corrupt" in broken
    assert console_errors(driver) == []


def test_a_training_run_gains_curve_points_without_a_reload(page, folder: Path) -> None:
    driver, url = page
    out = folder / "runs" / "growing"
    run = start("-m", "phalanx.cli", "train", "--model", "mlp", "--data", "synthetic",
                "--strategy", "single", "--epochs", "1000", "--eval-every", "100000",
                "--no-progress",
                "--checkpoint-every", "0", "--out", str(out))
    try:
        until(lambda: (out / "events.jsonl").exists(), what="the run to start")
        show(driver, url, "compare=runs/growing")
        points = lambda: int(driver.execute_script(  # noqa: E731
            "const c = document.querySelector('#chart-step');"
            "return c ? c.dataset.points : 0") or 0)
        first = until(points, what="the first points")
        driver.execute_script("window.notReloaded = true")
        until(lambda: points() > first, what="more points")
        assert driver.execute_script("return window.notReloaded") is True
        # one read (the table is redrawn as points come: a held element goes stale)
        assert driver.execute_script(
            "return document.querySelector('#figs tr[data-run=\"runs/growing\"]')"
            ".dataset.status") == "running"
    finally:
        stop(run)
    assert console_errors(driver) == []


def test_two_simulated_schedules_jct_distributions_are_drawn(page) -> None:
    driver, url = page
    show(driver, url, "jct=sims/cmp%23fifo-topology|sims/cmp%23las-topology")
    seen = driver.execute_script(  # one read: a held element can go stale on a redraw
        "const c = document.querySelector('#jct-cdf');"
        "return [c.dataset.series, c.dataset.points, !!c.querySelector('canvas'),"
        " [...document.querySelectorAll('tr[data-schedule]')].map(r => r.dataset.schedule)]")
    assert seen[:3] == ["2", "160", True]  # 80 jobs' JCTs, twice
    assert seen[3] == ["sims/cmp#fifo-topology", "sims/cmp#las-topology"]
    assert console_errors(driver) == []


def test_a_lost_server_is_drawn_lost(page) -> None:
    """The server the schedule's state names lost: marked on the map, each of its devices
    drawn lost (not in its job's colour), the other server's devices free."""
    driver, url = page
    show(driver, url, "schedule=sims/lost")
    until(lambda: driver.find_elements("css selector", ".server"), what="the map")
    lost = driver.execute_script(
        "return [...document.querySelectorAll('.server.lost')].map(s => s.title)")
    assert lost == ["s1 (?): lost"]
    devs = driver.execute_script(
        "return [...document.querySelectorAll('.dev')].map(d => [d.dataset.dev,"
        " d.classList.contains('lost'), d.title])")
    assert [(d, bad) for d, bad, _ in devs] == [("0", False), ("1", False), ("2", True),
                                                ("3", True)]
    assert devs[2][2].endswith(": lost (a)") and devs[0][2].endswith(": free")
    assert console_errors(driver) == []


def test_a_preempted_jobs_bar_ends_at_its_recorded_stop(page) -> None:
    """The timeline's bars from a schedule's stops (jobs.csv's ``stops``): a job placed at
    1, stopped at 4 and placed again at 9 has a bar 1-4, not 1-9; without stops (an older
    file) a bar runs to the next placement."""
    driver, url = page
    show(driver, url, "schedule=sims/lost")
    until(lambda: driver.find_elements("css selector", ".server"), what="the page")
    jobs = {"name": ["a"], "end": [12.0], "placements": [[[1.0, [0]], [9.0, [1]]]],
            "stopped": [None]}
    bars = driver.execute_script(
        "return [PX.segments(arguments[0]), PX.segments(arguments[1])]"
        ".map(s => s.map(x => [x.from, x.to, x.kind]))",
        {"jobs": {**jobs, "stops": [[4.0, 12.0]]}, "clock": None},
        {"jobs": {**jobs, "stops": [[]]}, "clock": None})
    assert bars == [[[1, 4, "start"], [9, 12, "move"]], [[1, 9, "start"], [9, 12, "move"]]]
    assert console_errors(driver) == []


def raw_get(url: str, path: str) -> tuple[int, str]:
    """A request sent as written (a browser or urllib would resolve the '..' first)."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    conn.endheaders()
    r = conn.getresponse()
    return r.status, r.read().decode(errors="replace")


def test_dot_dot_and_absolute_paths_are_refused(page, folder: Path) -> None:
    driver, url = page
    secret = folder.parent / "secret.json"
    secret.write_text('{"secret": 1}')
    for path in ("/files/../secret.json", "/files/%2e%2e/secret.json", f"/files/{secret}",
                 f"/files/{folder}/runs/done/summary.json", "/files/runs/../../secret.json",
                 "/api/run?id=../x", f"/api/run?id={folder}", "/api/schedule?id=/etc",
                 "/static/../app.py", "/../secret.json"):
        status, body = raw_get(url, path)
        assert status in (400, 404), (path, status)
        assert "secret" not in body.replace("secret.json", ""), path
    assert raw_get(url, "/files/runs/done/summary.json")[0] == 200
    driver.get(url + "api/run?id=../../etc")  # (a browser resolves a '..' in the path itself)
    assert "'..' is refused" in driver.page_source
    driver.get(url + "files//etc/passwd")
    assert "absolute paths are refused" in driver.page_source and "root:" not in \
        driver.page_source
    # the browser logs the two refusals (400) it was sent to see; nothing else
    assert [e for e in console_errors(driver) if "400 (Bad Request)" not in e] == []


def test_schedule_dashboard_colours_a_job_placed_then_preempted(page, tmp_path: Path) -> None:
    driver, _ = page
    jobs = tmp_path / "jobs.yaml"
    cfg = "{model: mlp, data: synthetic, epochs: 200, strategy: sync, tensorboard: false}"
    jobs.write_text(f"jobs:\n  - {{name: alpha, arrival: 0, gpus: 1, config: {cfg}}}\n"
                    f"  - {{name: beta, arrival: 1, gpus: 1, config: {cfg}}}\n")
    sched = start("-m", "phalanx.cli", "schedule", "--jobs", str(jobs), "--cluster",
                  "uniform:1,1,1,1", "--policy", "rr", "--slot", "2", "--dashboard", "0",
                  "--out", str(tmp_path / "out"))
    try:
        url = url_of(sched)
        until(lambda: (tmp_path / "out" / "scheduler-state.json").exists(), what="a state")
        show(driver, url, "schedule=.")
        def colour() -> tuple[str, str] | None:  # one read: the map is redrawn as it changes
            return tuple(driver.execute_script(
                "const d = document.querySelector('.dev[data-dev=\"0\"]');"
                "return d ? [d.dataset.job, getComputedStyle(d).backgroundColor] : ['?', '']"))
        free = colour()[1] if colour()[0] == "" else None
        placed = until(lambda: colour()[0] == "alpha" and colour(), what="alpha placed")
        assert placed[1] != free
        driver.execute_script("window.notReloaded = true")
        # rr's round gives the device to beta: alpha is preempted, its device changes colour
        after = until(lambda: colour()[0] != "alpha" and colour(), what="alpha preempted")
        assert after[1] != placed[1]
        assert driver.execute_script("return window.notReloaded") is True
        state = json.loads((tmp_path / "out" / "scheduler-state.json").read_text())
        assert state["jobs"]["alpha"]["fields"]["preemptions"] >= 1
        assert driver.execute_script(
            "return document.querySelector('tr[data-job=\"alpha\"]').textContent"
        ).startswith("alpha")
        assert console_errors(driver) == []
    finally:
        driver.get("about:blank")  # the page's dashboard ends with the schedule
        stop(sched)
