# The two commands a new checkout needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What each use needs: running graphs needs the package and its runtime dependencies only;
# the tests add the test extras and PyTorch (the oracle).
RUNTIME := $(VENV)/.installed-runtime
TESTDEPS := $(VENV)/.installed-test
# Elsewhere, PyTorch's default Linux wheel is its multi-GB CUDA build; for the CPU build:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: demo test test-fast bench install browser graphviz clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata or the compiled core changes.
$(RUNTIME): pyproject.toml setup.py autograd_run/engine/_core.c $(wildcard autograd_run/engine/csrc/*) \
		autograd_run/graphs/_build.c \
		autograd_run/graphs/_draw.c | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# torch==2.13.0 is the CPU build that the tests use as their oracle; then the zoo's external models
# (torchvision, timm, transformers), which need torch in place first.
# (pyproject.toml's `zoo` extra, named here so that pip does not rebuild the project a third time.)
ZOO_EXTRAS := 'torchvision==0.28.0' 'timm>=1.0' 'transformers>=4.50'
# Holistic Trace Analysis (tests/test_hta.py) without its dependency list, which pulls in jupyterlab: what it needs
# to run is in the test extra (pandas<3, networkx, plotly, pydot).
HTA := 'holistictraceanalysis==0.5.0'
$(TESTDEPS): $(RUNTIME)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps $(HTA)
	$(PY) -m pip install -q 'torch==2.13.0' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q $(ZOO_EXTRAS) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $@

install: $(RUNTIME)

demo: $(RUNTIME)
	$(VENV)/bin/autograd-run validate example:mlp
	$(VENV)/bin/autograd-run example:mlp --trace demo-trace.json

# The engine's (and the seeded drawing's) tests run a second time on the pure-Python twins of the compiled parts.
PURE_TESTS := tests/test_engine.py tests/test_engine_semantics.py tests/test_scheduling.py \
	tests/test_order_vs_torch.py tests/test_devices.py tests/test_simulate.py tests/test_checkpoint_kind.py \
	tests/test_recording.py tests/test_summary.py tests/test_tracers.py tests/test_chrome_trace.py \
	tests/test_seeding.py tests/test_prepare.py tests/test_graph_files.py tests/test_graph_hardening.py \
	tests/test_hooks_held.py

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


# The Perfetto UI test drives the system Chromium: installed here where the machine
# allows (root with apt-get); elsewhere that test skips and says why. Never fails the build.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the Perfetto UI test"; \
		export DEBIAN_FRONTEND=noninteractive; \
		{ apt-get install -y -qq chromium >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; } || \
		echo "note: chromium could not be installed; the Perfetto UI test will skip"; \
	else \
		echo "note: no chromium here (installing it needs root and apt-get); the Perfetto UI test will skip"; \
	fi

# The suite runs on TEST_JOBS pytest-xdist workers (its tests use their own temporary folders, free ports and
# child processes); `make test TEST_JOBS=0` runs it in one process.
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS))

test: $(TESTDEPS) browser graphviz
	$(PY) -m pytest -q $(XDIST)
	AUTOGRAD_RUN_PURE_PYTHON=1 $(PY) -m pytest -q $(XDIST) $(PURE_TESTS)

# Everything but the whole-program tests (tests/conftest.py's SLOW_MODULES): about 2 minutes here.
test-fast: $(TESTDEPS)
	$(PY) -m pytest -q $(XDIST) -m "not slow"

bench: $(TESTDEPS)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-trace.json
