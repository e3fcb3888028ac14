"""``phalanx dashboard DIR``: a read-only web page over a folder of runs and schedules.

It finds what the folder holds by its files (``events.jsonl``, ``summary.json``,
``scheduler-state.json``, ``jobs.csv``), reads them without ever writing, and serves a page
that draws them with uPlot (shipped in ``static/``, MIT). ``phalanx schedule --dashboard
PORT`` serves the same page beside a live schedule. Nothing here imports torch: the page
reads files only (docs/dashboard.md).
"""
