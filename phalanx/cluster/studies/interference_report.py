"""``interference.md``: a measured interference table as a page — each class's solo rate,
a matrix per level (row a, column b: what a keeps beside b, with its interval), and how
well the pair model predicts each measured pair when fitted without it
(:func:`held_out_errors`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from phalanx.cluster.model.interference import PairTable, held_out_errors


def _cell(kept: float, ci: tuple[float, float] | None) -> str:
    if ci is None or ci[0] == ci[1]:
        return f"{kept:.2f}"
    return f"{kept:.2f} ({ci[0]:.2f}-{ci[1]:.2f})"


def matrix(table: PairTable, level: str, classes: Sequence[str]) -> list[str]:
    """Row a, column b: a's kept beside b (a pair of a class with itself: the first
    copy's; the second's is ``kept_b`` in the JSON)."""
    cells: dict[tuple[str, str], str] = {}
    for p in table.pairs:
        if p.level != level:
            continue
        cells[(p.a, p.b)] = _cell(p.kept_a, p.kept_a_ci)
        cells.setdefault((p.b, p.a), _cell(p.kept_b, p.kept_b_ci))
    lines = ["| a \\ b | " + " | ".join(f"`{c}`" for c in classes) + " |",
             "|---|" + "---|" * len(classes)]
    for a in classes:
        lines.append(f"| `{a}` | " + " | ".join(cells.get((a, b), "") for b in classes)
                     + " |")
    return lines


def held_out_lines(table: PairTable) -> list[str]:
    rows = held_out_errors(table)
    lines = ["| level | a | b | measured | predicted | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['level']} | `{r['a']}` | `{r['b']}` | {r['measured']:.3f} | "
                     f"{r['predicted']:.3f} | {r['error']:.1%} |")
    for level in table.levels():
        errs = [r["error"] for r in rows if r["level"] == level]
        lines.append("")
        lines.append(f"Median |error| at level `{level}`: {statistics.median(errs):.1%} "
                     f"({len(errs)} ordered pairs).")
    return lines


def markdown(table: PairTable, classes: Sequence[str]) -> str:
    out = ["# Interference profile", "", table.source, "",
           "kept = a job's samples/s beside the other / alone (1: no interference, 0.5: half "
           "speed); levels: `core` = both jobs pinned to one core, `server` = one core each "
           "on this machine, `link` = two test hosts (one core each) joined by a shaped "
           "link, a job of several processes across them, a single-process job on one. "
           "Cells: the median over the repeats (the smallest-largest "
           "repeat in brackets).", "", "## Solo rates", "",
           "| class | solo samples/s (median) | range | runs | on the shaped link |",
           "|---|---|---|---|---|"]
    for c in classes:
        info = table.classes[c]
        lo, hi = info.get("solo_range", [info["solo"], info["solo"]])
        link = ""
        if "solo_link" in info:
            llo, lhi = info["solo_link_range"]
            link = (f"{info['solo_link']:.1f} ({llo:.1f}-{lhi:.1f}) at "
                    f"{info['link_mbit']:g} Mbit/s, {info['processes']} process(es)")
        out.append(f"| `{c}` | {info['solo']:.1f} | {lo:.1f}-{hi:.1f} | "
                   f"{info.get('solo_runs', '')} | {link} |")
    for level in table.levels():
        out += ["", f"## Level `{level}`: what a (row) keeps beside b (column)", "",
                *matrix(table, level, classes), "", "Both sides of each pair:", "",
                "| a | b | kept a | kept b | sum |", "|---|---|---|---|---|"]
        for p in table.pairs:
            if p.level == level:
                out.append(f"| `{p.a}` | `{p.b}` | {_cell(p.kept_a, p.kept_a_ci)} | "
                           f"{_cell(p.kept_b, p.kept_b_ci)} | {p.kept_a + p.kept_b:.2f} |")
    out += ["", "## Held-out prediction", "",
            "Each measured ordered pair predicted by the pair model (kept = 1 / (1 + s_a "
            "p_b), per level) fitted on every other pair "
            "(`phalanx.cluster.model.interference.held_out_errors`); error = |predicted - "
            "measured| / measured.", "", *held_out_lines(table)]
    return "\n".join(out) + "\n"


def write_markdown(table: PairTable, classes: Sequence[str], path: Path) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(markdown(table, classes))
    tmp.replace(path)
