#!/usr/bin/env bash
# traintel's device checks in one command (issue 38), on a machine with one CUDA GPU:
#   1. the gpu-marked tests (today tests/test_gpu_cuda.py: sync-free step with every GPU feature
#      on, CUDA-event times, NVML gauges, clocks/throttle/energy, MFU against both peaks,
#      window energies vs NVML's delta, the measured peak's reproducibility);
#   2. benchmarks/gpu_check.py, which prints the figures: window energies vs the NVML delta over
#      the loop, the measured bf16 peak 3 times, syncs with every GPU feature on, the overhead
#      ratios (launch-bound and real step), and a JSON of the issue's verdicts.
# Everything goes to $OUT (gpu-check.log, gpu-check.json, gpu-tests.xml); without $OUT, to a
# temporary folder it names. About 4-5 minutes on an H100; each part is bounded (timeout).
#
# Python: $PYTHON, else python3. OpenTelemetry and orjson, if that Python lacks them, come from
# .whl/ (scripts/gpu-device-wheels.sh, no network needed) or, failing that, from pip.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t traintel-gpu-XXXX)}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
echo "traintel gpu device check: $(date -u +%FT%TZ), output in $OUT"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed file(s)"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader 2>&1 || echo "no nvidia-smi"

if ! "$PY" -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, orjson" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    echo "installing $(ls .whl/*.whl | wc -l) wheels from .whl into /tmp/traintel-site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/traintel-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/traintel-site
  else
    echo "no .whl: installing the project with pip (needs a network)"
    "$PY" -m pip install -q -e '.[gpu]' pytest || exit 1
  fi
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, traintel; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), '| traintel', traintel.__version__, traintel.__file__)" || exit 1

status=0
gpu_files=$(grep -l 'pytest.mark.gpu' tests/test_*.py)
echo "=== 1/2 gpu-marked tests:" $gpu_files
timeout 300 "$PY" -m pytest -m gpu $gpu_files -v -rs -p no:cacheprovider \
  --junitxml="$OUT/gpu-tests.xml" || status=1
echo "=== 2/2 benchmarks/gpu_check.py"
timeout 330 "$PY" benchmarks/gpu_check.py --json "$OUT/gpu-check.json" || status=1
echo "done: status $status, files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $status
