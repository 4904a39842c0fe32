#!/usr/bin/env bash
# The single-GPU check of the hardware loop, in one call, well under 5 minutes:
#   1. calibrate matmul efficiency and memory copy bandwidth on one GPU,
#   2. predict scenarios/single-gpu.yaml with that profile,
#   3. replay the same step on the GPU (NCCL backend, one rank),
#   4. compare, and write every number under $OUT (default out/gpu-check).
# Without a GPU it falls back to the same loop on one CPU process (gloo), so the
# script itself is checked anywhere. Run from anywhere: bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  backend=nccl
  scenario=(scenarios/single-gpu.yaml)
  # H100/H200 SXM dense BF16 peak, 989.4 TFLOP/s (NVIDIA H100 whitepaper; the H200
  # datasheet gives the same tensor-core rates).
  calibrate=(--peak-flops "989.4 TFLOP/s")
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/device.txt" || true
else
  echo "gpu_check: torch sees no GPU; running the same loop on one CPU process (gloo)"
  backend=gloo
  scenario=(scenarios/cpu-tiny.yaml --set cluster.gpus_per_node=1 --set parallel.tp=1)
  calibrate=(--quick)
  echo "cpu fallback: no GPU visible to torch" > "$OUT/device.txt"
fi
started=$(date +%s)
"$PY" -m simulator.cli calibrate --nproc 1 --backend "$backend" --out "$OUT/profile.json" "${calibrate[@]}"
"$PY" -m simulator.cli run "${scenario[@]}" --set "cluster.profile=$OUT/profile.json" \
  --out "$OUT/predicted" > "$OUT/predicted.txt"
"$PY" -m simulator.cli replay "${scenario[@]}" --backend "$backend" --out "$OUT/measured"
"$PY" -m simulator.cli compare "$OUT/predicted" "$OUT/measured" | tee "$OUT/compare.txt"
"$PY" - "$OUT" "$started" <<'PY'
import json, sys, time
out, started = sys.argv[1], int(sys.argv[2])
profile = json.load(open(f"{out}/profile.json"))
report = json.load(open(f"{out}/measured/compare.json"))
gpu = profile["gpu"]
lines = [
    f"device: {profile['device']['name']} ({profile['software']['backend']}, torch {profile['software']['torch']})",
    f"matmul efficiency: {gpu['matmul_efficiency']:.3f} of {gpu['peak_flops'] / 1e12:.1f} TFLOP/s",
    f"kernel launch overhead: {gpu['kernel_launch_overhead'] * 1e6:.2f} us",
    f"memory copy bandwidth: {gpu['hbm_bandwidth'] / 1e9:.1f} GB/s",
    f"step time: predicted {report['step_time']['predicted_s']:.6g} s, measured "
    f"{report['step_time']['measured_s']:.6g} s, error {100 * report['step_time']['error']:+.1f}%",
    f"wall time of the check: {time.time() - started:.0f} s",
]
open(f"{out}/gpu_check.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
