# Two commands: `make demo` and `make test`. Each sets up .venv on a fresh machine first.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: setup demo test bench lint clean mutate

$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null && [ ! -d /usr/share/datasets/fashion-mnist ]; then \
		(apt-get update -q && apt-get install -y -q dataset-fashion-mnist) || echo "warning: could not install dataset-fashion-mnist"; fi
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 numpy
	$(PIP) install -q -e '.[test,ray]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m phalanx.cli demo

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15

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
