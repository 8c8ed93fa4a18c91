#!/usr/bin/env bash
# The Python packages traintel needs that the GPU device image lacks (it has torch, pytest,
# nvidia-ml-py, grpcio, protobuf, requests, rich; no OpenTelemetry, no orjson), as x86-64 /
# CPython 3.12 wheels in .whl/ at the repository root, for scripts/gpu-device-check.sh to install
# there without a network. Run it here, where pip reaches an index; the versions are this
# checkout's .venv's (what the CPU suite passed with), else the pins below.
#
#   bash scripts/gpu-device-wheels.sh      # then carry ".whl" with the device run
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-common-dir)/info/exclude"  # (a worktree's .git is a file)
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
PACKAGES=(
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
  opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-common
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
  opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport
  googleapis-common-protos protobuf orjson
)
declare -A PINS=(
  [opentelemetry-api]=1.45.2 [opentelemetry-sdk]=1.45.2 [opentelemetry-semantic-conventions]=0.66b2
  [opentelemetry-proto]=1.45.2 [opentelemetry-exporter-otlp]=1.45.2
  [opentelemetry-exporter-otlp-proto-common]=1.45.2 [opentelemetry-exporter-otlp-proto-grpc]=1.45.2
  [opentelemetry-exporter-otlp-proto-http]=1.45.2 [opentelemetry-exporter-otlp-common]=0.66b2
  [opentelemetry-exporter-http-transport]=0.66b2 [googleapis-common-protos]=1.76.0 [protobuf]=7.36.2
  [orjson]=3.13.0
)
SPECS=()
for name in "${PACKAGES[@]}"; do
  version=""
  if [ -x .venv/bin/python ]; then
    version=$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)
  fi
  SPECS+=("$name==${version:-${PINS[$name]}}")
done
rm -rf .whl && mkdir .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${SPECS[@]}"
ls .whl
du -sh .whl
