"""Summaries and output files of a simulation: summary.json, jobs.csv, PNG plots."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.result import SimResult


@dataclass(frozen=True)
class Summary:
    """One run's figures (JCT, queueing, makespan, utilisation, fragmentation,
    preemptions): a row of summary.json and of every table."""

    ordering: str
    placement: str
    cluster: str
    trace: str
    gpus: int
    jobs: int
    finished: int
    rejected: int
    rejected_oversize: int      # of ``rejected``: gangs larger than the cluster can hold
    unfinished: int             # admitted but never finished (could not start)
    failed: int                 # live mode: the job's process exited with an error
    mean_jct_s: float
    median_jct_s: float
    p99_jct_s: float
    mean_queue_delay_s: float
    makespan_s: float
    utilisation_mean: float
    fragmentation_mean: float
    fragmentation_blocked: int
    preemptions: int
    events: int
    wall_s: float
    events_per_s: float
    skipped_rows: int = 0       # malformed trace rows left out (--skip-bad-rows)


def _time_mean(times: list[float], values: list[float], end: float) -> float:
    if not times or end <= times[0]:
        return 0.0
    t = np.asarray(times + [end])
    return float(np.sum(np.diff(t) * np.asarray(values)) / (end - times[0]))


def summarise(res: SimResult, ordering: str, placement: str, cluster: str,
              trace: str) -> Summary:
    done = [j for j in res.jobs if j.end >= 0 and not j.failure]
    failed = sum(1 for j in res.jobs if j.failure)
    jct = np.array([j.end - j.spec.submit for j in done]) if done else np.zeros(1)
    delay = np.array([(j.end - j.spec.submit) - j.executed for j in done]) if done \
        else np.zeros(1)
    start = min((j.spec.submit for j in res.jobs), default=0.0)
    end = max((j.end for j in res.jobs if j.end >= 0), default=start)
    util = _time_mean(res.times, [b / res.capacity for b in res.busy], end)
    frag = _time_mean(res.times, res.frag, end)
    return Summary(ordering, placement, cluster, trace, res.capacity,
                   len(res.jobs) + len(res.rejected), len(done), len(res.rejected),
                   res.oversize, len(res.jobs) - len(done) - failed, failed,
                   float(jct.mean()), float(np.median(jct)), float(np.percentile(jct, 99)),
                   float(delay.mean()), float(end - start), util, frag,
                   res.fragmentation_blocked, sum(j.preemptions for j in res.jobs),
                   res.events, res.wall_s, res.events / max(res.wall_s, 1e-9))


def _status(j: JobState) -> str:
    if j.failure:
        return f"failed: {j.failure}"
    return "finished" if j.end >= 0 else "unfinished"


def write_jobs_csv(res: SimResult, path: Path) -> None:
    """One row per job; ``placements`` lists ``start_time@device,device,...`` separated by
    ``;`` (one entry per (re)start; times to 0.1 s, as start and end: whole seconds made a
    move at 6.2 s read as 6, before the 6.2 s end of the job it waited for); ``stops`` the
    time each of those placements ended, in the same order (its last: the job's end)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "vc", "model", "gpus", "submit", "start", "end", "jct",
                    "queue_delay", "executed", "preemptions", "status", "placements",
                    "preemptible", "stops"])
        for j in res.jobs:
            s = j.spec
            jct = j.end - s.submit if j.end >= 0 else ""
            delay = (j.end - s.submit - j.executed) if j.end >= 0 else ""
            places = ";".join(f"{t:.1f}@" + ",".join(map(str, d)) for t, d in j.placements)
            w.writerow([s.id, s.name, s.vc, s.model, s.gpus, f"{s.submit:.1f}",
                        f"{j.start:.1f}", f"{j.end:.1f}", jct if jct == "" else f"{jct:.1f}",
                        delay if delay == "" else f"{delay:.1f}", f"{j.executed:.1f}",
                        j.preemptions, _status(j), places,
                        f"no: {s.not_preemptible}" if s.not_preemptible else "yes",
                        ";".join(f"{t:.1f}" for t in j.stops)])
        for s, reason in res.rejected:
            w.writerow([s.id, s.name, s.vc, s.model, s.gpus, f"{s.submit:.1f}", "", "", "", "",
                        "", 0, f"rejected: {reason}", "", "", ""])


def write_summary(summary: Summary, path: Path) -> None:
    path.write_text(json.dumps(asdict(summary), indent=2) + "\n")


def _downsample(times: list[float], values: list[float], n: int = 4000
                ) -> tuple[np.ndarray, np.ndarray]:
    t, v = np.asarray(times), np.asarray(values, dtype=float)
    if len(t) <= n:
        return t, v
    grid = np.linspace(t[0], t[-1], n)
    idx = np.searchsorted(t, grid, side="right") - 1
    return grid, v[idx]


def write_plots(results: list[tuple[str, SimResult]], out: Path) -> list[Path]:
    """JCT CDF, GPU utilisation over time and queue length over time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, res in results:
        jct = np.sort([(j.end - j.spec.submit) / 3600 for j in res.jobs if j.end >= 0])
        if len(jct):
            ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    for name, attr, ylabel in (("utilisation.png", "busy", "GPU utilisation"),
                               ("queue.png", "queue", "jobs waiting")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for label, res in results:
            vals = getattr(res, attr)
            if attr == "busy":
                vals = [b / res.capacity for b in vals]
            t, v = _downsample(res.times, vals)
            ax.step(t / 3600, v, where="post", label=label, linewidth=0.8)
        ax.set_xlabel("simulated time (hours)")
        ax.set_ylabel(ylabel)
        ax.set_title(ylabel + " over time")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
