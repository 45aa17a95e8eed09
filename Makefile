# The two commands a new checkout needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata changes. torch==2.13.0 is the CPU
# build that the tests use as their oracle.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' 'torch==2.13.0'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/autograd-run validate example:mlp
	$(VENV)/bin/autograd-run example:mlp --trace demo-trace.json

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-trace.json
