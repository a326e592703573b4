#!/usr/bin/env bash
# One-call GPU check (`vlarun bench gpu-check`): parity vs transformers, the engine at
# openvla-7b's shape, pi0 and CogACT end to end, TRIAGE at B = 34%, Jacobi + early exit and NVML
# energy, timed side by side on one GPU in under 8 minutes; JSON under OUT_DIR.
#
#   scripts/gpu-check.sh [OUT_DIR] [--device cuda|cuda:N|cpu] [--quick]
#
# OUT_DIR defaults to $OUT, else results/gpu-check; the device to cuda. `--device cpu --quick`
# is the CI smoke run (tiny shapes, its numbers describe nothing). The Python used is $PYTHON,
# else the first of .venv/bin/python, python3, python that has torch (with CUDA, when the device
# is CUDA), so a bare GPU machine's python3 works with this checkout on PYTHONPATH.
# Exit status: non-zero when any section failed (each section's error is in the JSON).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out_dir=${OUT:-results/gpu-check}
device=cuda
quick=()
while (($#)); do
  case $1 in
    --device) device=${2:?--device needs a value}; shift 2 ;;
    --device=*) device=${1#--device=}; shift ;;
    --quick) quick=(--quick); shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
    *) out_dir=$1; shift ;;
  esac
done

py=${PYTHON:-}
if [[ -z $py ]]; then
  want='import torch'
  [[ $device == cuda* ]] && want='import torch; assert torch.version.cuda'
  for candidate in "$root/.venv/bin/python" python3 python; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "$want" 2>/dev/null; then
      py=$candidate
      break
    fi
  done
  # None fits: the first with torch at all, so vlarun itself says what is missing.
  if [[ -z $py ]]; then
    for candidate in "$root/.venv/bin/python" python3 python; do
      command -v "$candidate" >/dev/null && py=$candidate && break
    done
  fi
fi
mkdir -p "$out_dir"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -q >"$out_dir/nvidia-smi-q.txt" 2>&1 || true
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export VLARUN_GPU_CHECK_COMMAND="scripts/gpu-check.sh $out_dir --device $device ${quick[*]:-}"
echo "gpu-check: $py on $device${quick:+ (quick)} -> $out_dir/gpu-check.json" >&2
# stdout (the summary) stays on stdout; stderr (progress, errors) also goes to the log.
set +e
{ "$py" -m vlarun.cli bench gpu-check --out "$out_dir" --device "$device" "${quick[@]}" \
  2>&1 1>&3 3>&- | tee "$out_dir/gpu-check.log" >&2; } 3>&1
status=$? # pipefail: python's status when it failed
set -e
if [[ -f $out_dir/gpu-check.json ]]; then
  echo "gpu-check: results in $out_dir/gpu-check.json (log: $out_dir/gpu-check.log), exit $status"
else
  echo "gpu-check: no results written (log: $out_dir/gpu-check.log), exit $status" >&2
fi
exit "$status"
