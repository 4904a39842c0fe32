#!/usr/bin/env bash
# The wheel folder benchmarks/gpu_check.sh installs from on a GPU node without network:
# parasim's pure-Python dependencies (and the two compiled ones, pydantic-core and
# PyYAML, for the node's Python), about 30 MB. Run where there is network:
#
#   bash benchmarks/gpu_wheels.sh DIR [--python-version 3.11] [--platform manylinux2014_x86_64]
#
# Without --python-version and --platform, the wheels are for this machine's Python.
# torch and numpy are not included: the GPU node's own are used.
set -euo pipefail
DIR=${1:?usage: gpu_wheels.sh DIR [--python-version X.Y] [--platform TAG]}
shift
target=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) target+=(--python-version "$2" --only-binary=:all:); shift 2 ;;
    --platform) target+=(--platform "$2" --only-binary=:all:); shift 2 ;;
    *) echo "gpu_wheels: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR"
"${PYTHON:-python3}" -m pip download --quiet --dest "$DIR" "${target[@]}" \
  "simpy>=4.1" "networkx>=3.0" "pydantic>=2.5,<3" "pyyaml>=6.0" "rich>=13.0" \
  "plotly>=5.18" setuptools wheel
ls "$DIR"
