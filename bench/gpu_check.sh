#!/usr/bin/env bash
# GPU check: run on a machine with an NVIDIA GPU (under 5 minutes).
# Installs what it needs: what the machine's Python already has (a GPU image
# with CuPy and PyTorch, perhaps without network), wheels in ./.whl for what
# it lacks, else PyPI. Runs the tests that need CUDA, a two-stream and a
# cross-device graph through the CLI, the simulation with costs from a CUDA
# profile against PyTorch (bench/gpu_profcosts.py, when torch with CUDA is
# installed; GPU_CHECK_KEEP=DIR keeps its graphs and profiler traces), and
# prints PASS or FAIL.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-/tmp/autograd-run-gpu-venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || { echo "FAIL: cannot create venv"; exit 1; }
fi
# What $PY already has (a GPU image with CuPy, PyTorch and the rest, perhaps with no network at all)
# is lent to the venv by a .pth file: --system-site-packages would reach the base interpreter's
# packages, not those of a venv that $PY may itself be (such images keep their packages in one).
"$PY" -c "import site; print('\n'.join(site.getsitepackages()))" \
  >"$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_gpu_check_base.pth"
PIP="$VENV/bin/python -m pip install -q"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  # Wheels carried for what the image lacks (installed as they are: their own needs come from the image).
  $PIP --no-index --no-deps .whl/*.whl || { echo "FAIL: install from .whl"; exit 1; }
fi
if "$VENV/bin/python" -c "import click, numpy, rich, yaml, msgspec, threadpoolctl, ml_dtypes, cupy, pytest, pytest_timeout"; then
  # Everything is there: build and install only this package (no index needed).
  $PIP --no-deps --no-build-isolation -e . || { echo "FAIL: install"; exit 1; }
elif [ -d .whl ]; then
  $PIP --no-index --find-links .whl -e '.[cuda,test]' || { echo "FAIL: install from .whl"; exit 1; }
else
  $PIP -e '.[cuda,test]' || { echo "FAIL: install"; exit 1; }
fi
nvidia-smi -L || true
"$VENV/bin/python" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())" \
  || { echo "FAIL: cupy cannot see a GPU"; exit 1; }
status=0
"$VENV/bin/python" -m pytest -q -m cuda -rs tests/test_devices.py || status=1
TMP=$(mktemp -d)
"$VENV/bin/python" - "$TMP" <<'PY' || status=1
import sys, json
sys.path.insert(0, "tests")
from test_devices import two_stream_graph, cross_device_graph
from autograd_run.graphs.dump import dump_graph
dump_graph(two_stream_graph(), sys.argv[1] + "/two_stream.json")
dump_graph(cross_device_graph(), sys.argv[1] + "/cross.json")
PY
for g in two_stream cross; do
  "$VENV/bin/autograd-run" "$TMP/$g.json" --devices cuda --trace "$TMP/$g.trace.json" || status=1
done
"$VENV/bin/autograd-run" example:pipeline --backend auto --no-summary || status=1
# Simulation with PyTorch-measured costs against PyTorch on the GPU (needs a CUDA build of torch in the
# venv, e.g. from ./.whl; exit 2 = skipped).
"$VENV/bin/python" -m bench.gpu_profcosts ${GPU_CHECK_KEEP:+--keep "$GPU_CHECK_KEEP"}; rc=$?
if [ $rc -eq 1 ]; then status=1; elif [ $rc -eq 2 ]; then echo "(GPU profiled costs skipped: no CUDA PyTorch)"; fi
if [ $status -eq 0 ]; then echo "PASS: GPU check"; else echo "FAIL: GPU check"; fi
exit $status
