#!/usr/bin/env bash
# The one-GPU check of the hardware loop: self-contained, one call, a few minutes.
#
#   bash benchmarks/gpu_check.sh --wheels DIR [--device auto|cuda|cpu] [--out DIR]
#
#   1. makes a virtual environment in OUT that sees the packages of the Python that runs
#      the script (PYTHON, default python3: a venv's, a conda environment's or the
#      system's, whichever holds the machine's own torch and numpy) and installs into it,
#      with pip --no-index (nothing from the network), the pure-Python dependencies from
#      the wheel folder DIR and then parasim from this checkout with --no-deps;
#   2. calibrates one device at the shapes of scenarios/single-gpu.yaml
#      (parasim calibrate --scenario), 3. predicts the scenario with that profile,
#   4. replays it on the device and 5. compares; 6. replays it again with the profiler,
#      calibrates from those traces alone, predicts and compares against them; every
#      file lands in OUT, with a summary in OUT/gpu_check.txt.
#
# --device cpu runs the same loop on one CPU process (gloo) with single-gpu.yaml shrunk
# to a CPU's size, so every step of the script is checked where there is no GPU.
# Make the wheel folder beforehand, on a machine with network and the GPU node's Python:
#   bash benchmarks/gpu_wheels.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEVICE=auto
OUT=out/gpu-check
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    *) echo "gpu_check: unknown argument $1 (use --device, --out, --wheels)" >&2; exit 2 ;;
  esac
done
if [ -z "$WHEELS" ] || [ ! -d "$WHEELS" ]; then
  echo "gpu_check: --wheels DIR: a folder of wheels made by benchmarks/gpu_wheels.sh" >&2
  exit 2
fi
WHEELS=$(cd "$WHEELS" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
started=$(date +%s)

# 1. the environment: PY's torch and numpy, everything else from the wheel folder
"$PY" -c 'import torch, numpy' || {
  echo "gpu_check: $PY has no torch (and numpy); name the Python that has, e.g. PYTHON=..." >&2
  exit 2
}
# A venv made with --system-site-packages sees the base interpreter's packages, not
# those of the venv (or conda environment) PY may belong to: instead, a .pth file in
# the new venv adds every site folder PY reads, after the venv's own, as PY's site
# module would (its .pth files included). What the steps below install shadows them.
"$PY" -m venv "$OUT/venv"
VPY="$OUT/venv/bin/python"
"$PY" - "$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" <<'PY'
import site
import sys
from pathlib import Path

folders = site.getsitepackages()
if site.ENABLE_USER_SITE:
    folders.append(site.getusersitepackages())
lines = [f"import site; site.addsitedir({folder!r})" for folder in folders]
(Path(sys.argv[1]) / "_gpu_check_outer.pth").write_text("\n".join(lines) + "\n")
PY
"$VPY" -c 'import torch, numpy' || {
  echo "gpu_check: the check's environment in $OUT/venv cannot import $PY's torch" >&2
  exit 2
}
"$VPY" -m pip install --quiet --no-index --find-links "$WHEELS" --ignore-installed \
  simpy networkx pydantic pyyaml rich plotly setuptools wheel
"$VPY" -m pip install --quiet --no-index --find-links "$WHEELS" --no-deps --no-build-isolation "$ROOT"
cd "$OUT"  # from here on, parasim is the installed one, not the checkout

if [ "$DEVICE" = auto ]; then
  if "$VPY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    DEVICE=cuda
  else
    DEVICE=cpu
  fi
fi
if [ "$DEVICE" = cuda ]; then
  backend=nccl
  scenario=("$ROOT/scenarios/single-gpu.yaml")
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > device.txt || true
else
  backend=gloo
  # one CPU process: the same model family, shrunk until a step takes about a second
  scenario=("$ROOT/scenarios/single-gpu.yaml" --set cluster.preset=cpu-localhost
    --set cluster.gpus_per_node=1 --set model.layers=2 --set model.hidden=256
    --set model.heads=4 --set model.seq_len=128 --set model.vocab=2048
    --set training.global_batch=4 --set training.micro_batch=2)
  echo "cpu: one gloo process, no GPU used" > device.txt
fi
# the scenario as a file, so that calibrate times exactly the ops the replay runs
"$VPY" - "${scenario[@]}" <<'PY'
import sys
import yaml
from simulator.request.scenario import apply_overrides

path, rest = sys.argv[1], sys.argv[2:]
overrides = [rest[i + 1] for i in range(0, len(rest), 2)]
raw = apply_overrides(yaml.safe_load(open(path)), overrides)
raw["name"] = "gpu-check"
yaml.safe_dump(raw, open("scenario.yaml", "w"))
PY
parasim() { "$VPY" -m simulator.cli.main "$@"; }
parasim calibrate --nproc 1 --backend "$backend" --scenario scenario.yaml --out profile.json
parasim run scenario.yaml --set cluster.profile=profile.json --out predicted > predicted.txt
parasim replay scenario.yaml --backend "$backend" --out measured
parasim compare predicted measured --out compared | tee compare.txt
# 6. the trace loop: the replay recorded with the profiler (Kineto, CUDA kernels on a
#    GPU), a profile made from its traces alone, the step predicted with it and set
#    against those traces
parasim replay scenario.yaml --backend "$backend" --profile --out traced
parasim calibrate --from-trace traced --out trace-profile.json | tee trace-calibrate.txt
parasim run scenario.yaml --set cluster.profile=trace-profile.json --outputs result,trace \
  --out trace-predicted > trace-predicted.txt
parasim compare trace-predicted traced/kineto --out trace-compared | tee trace-compare.txt
"$VPY" - "$OUT" "$started" <<'PY'
import json, sys, time
out, started = sys.argv[1], int(sys.argv[2])
profile = json.load(open(f"{out}/profile.json"))
report = json.load(open(f"{out}/compared/compare.json"))
measured = json.load(open(f"{out}/measured/result.json"))["measured"]
gpu = profile["gpu"]
lines = [
    f"device: {profile['device']['name']} ({profile['software']['backend']}, torch {profile['software']['torch']})",
    f"matmul efficiency: {gpu['matmul_efficiency']:.3f} of {gpu['peak_flops'] / 1e12:.1f} TFLOP/s",
    f"kernel launch overhead: {gpu['kernel_launch_overhead'] * 1e6:.2f} us",
    f"memory copy bandwidth: {gpu['hbm_bandwidth'] / 1e9:.1f} GB/s",
    f"ops measured at the scenario's shapes: {len(gpu['op_table'])}",
    f"step time: predicted {report['step_time']['predicted_s']:.6g} s, measured "
    f"{report['step_time']['measured_s']:.6g} s (median of {len(measured['step_times_s'])}, "
    f"spread {100 * measured['spread']:.0f}%), error {100 * report['step_time']['error']:+.1f}%",
]
traced = json.load(open(f"{out}/trace-compared/compare.json"))
replayed = json.load(open(f"{out}/traced/result.json"))["step_time_s"]
predicted = traced["step_time"]["predicted_s"]
lines += [
    f"trace loop: predicted {predicted:.6g} s from the replay's own traces, replay median "
    f"{replayed:.6g} s, error {100 * (predicted / replayed - 1):+.1f}%",
    *(
        f"  {d['place']}: {d['seconds'] * 1e3:+.3f} ms ({d['mechanism']}; {d['field']})"
        for d in traced["differences"]
    ),
    f"wall time of the check: {time.time() - started:.0f} s",
]
open(f"{out}/gpu_check.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
