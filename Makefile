# vlarun: `make demo` and `make test` set everything up on a fresh Debian machine.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PROMPT := put the red block on the blue mark

.PHONY: install demo test test-slow lint bench-engine parity clean

$(STAMP): pyproject.toml scripts/install-system.sh
	./scripts/install-system.sh
	test -x $(PY) || python3 -m venv $(VENV)
	# The local CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/vlarun info openvla-7b
	$(VENV)/bin/vlarun act --preset tiny-openvla --image assets/demo_64.png --instruction "$(PROMPT)"
	$(VENV)/bin/vlarun act --preset tiny-pi0 --image assets/demo_64.png --instruction "$(PROMPT)"

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

lint: install
	$(VENV)/bin/ruff check vlarun tests
	$(VENV)/bin/ruff format --check vlarun tests

parity: install
	$(VENV)/bin/vlarun check-parity

bench-engine: install
	$(VENV)/bin/vlarun bench engine

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
