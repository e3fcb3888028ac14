# Two commands: `make demo` and `make test`. Each sets up .venv on a fresh machine first.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: setup demo test bench lint clean mutate

$(STAMP): pyproject.toml
	@# Debian packages, as root: the data set, Slurm for the live Slurm engine's tests, and
	@# Chromium + its driver for the dashboard's browser tests (tests/e2e/test_dashboard_browser.py)
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		pkgs=""; [ -d /usr/share/datasets/fashion-mnist ] || pkgs="dataset-fashion-mnist"; \
		{ command -v slurmd && command -v slurmctld && command -v munged; } >/dev/null || pkgs="$$pkgs slurm-wlm munge"; \
		{ command -v chromium && command -v chromedriver; } >/dev/null || pkgs="$$pkgs chromium chromium-driver"; \
		[ -z "$$pkgs" ] || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkgs) \
			|| echo "warning: could not install:$$pkgs"; fi
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile torch==2.13.0 numpy
	$(PIP) install -q --no-compile -e '.[test,ray]'
	@# pip compiles what it installs one file at a time (torch and ray: ~25 s of the ~45 s);
	@# every core at once instead. The suite's hundreds of processes read these .pyc files
	@# (PYTHONDONTWRITEBYTECODE keeps them from writing their own); a file that does not
	@# compile (pip skips those too) is not an error
	-$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m compileall -q -j 0 phalanx
	$(PY) -m phalanx.cli demo

# two worker processes (pytest-xdist), each test file whole on one (its module-scoped
# clusters start once), the longest files first (tests/conftest.py): much of the suite
# waits on processes it started (README, Layout, for the times); TEST_WORKERS=0 runs it
# in one process
# The package is compiled first: with PYTHONDONTWRITEBYTECODE set (as on our machines)
# nothing writes a .pyc, and each of the hundreds of processes the suite starts compiled
# the ~180 phalanx modules it imports again (~0.2-0.3 s each; 11-14% of the subprocess-heavy
# tests' time, measured). Python still reads a .pyc the variable forbids it to write.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m compileall -q -j 0 phalanx tools bench
	$(PY) -m pytest -q -x --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b --quick || exit 1; done

# mutation testing of the numeric core (not CI: tens of minutes on 2 cores; one module at a
# time, each mutant against the fast in-process tests that cover it). Scores per module at
# the end; `$(PY) tools/mutate.py MODULE` runs one, `--report` only prints.
mutate: $(STAMP)
	$(PIP) install -q -e '.[test,mutate]'
	$(PY) tools/mutate.py

lint: $(STAMP)
	.venv/bin/ruff check phalanx tests bench

clean:
	rm -rf .venv runs
