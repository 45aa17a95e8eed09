# The two commands a new checkout needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean graphviz

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

# Graphviz's `dot` renders `draw`'s SVG/PNG. Installed here only where the system allows it
# (root and apt-get); otherwise, or if the install fails, the tests that need it skip with a reason.
graphviz:
	@if command -v dot >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Graphviz (apt-get install graphviz) for the drawing tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null 2>&1; } || \
		echo "could not install Graphviz: the tests that render SVG/PNG will skip"; \
	else echo "Graphviz's dot is not installed (needs root and apt-get here): the tests that render SVG/PNG will skip"; fi

test: $(STAMP) graphviz
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-trace.json
