# The two commands a new checkout needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata changes. torch==2.13.0 is the CPU
# build that the tests use as their oracle.
$(STAMP): pyproject.toml setup.py autograd_run/engine/_core.c | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' 'torch==2.13.0'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/autograd-run validate example:mlp
	$(VENV)/bin/autograd-run example:mlp --trace demo-trace.json

# The engine's tests run a second time on the pure-Python twin of the compiled core.
PURE_TESTS := tests/test_engine.py tests/test_engine_semantics.py tests/test_scheduling.py \
	tests/test_order_vs_torch.py tests/test_devices.py tests/test_simulate.py tests/test_checkpoint_kind.py \
	tests/test_recording.py tests/test_summary.py tests/test_tracers.py tests/test_chrome_trace.py

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

test: $(STAMP) browser
	$(PY) -m pytest -q
	AUTOGRAD_RUN_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_TESTS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-trace.json
