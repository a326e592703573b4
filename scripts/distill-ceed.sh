#!/usr/bin/env bash
# Distil a CEED-VLA student (issue 65) from a shipped mt10p teacher, on any machine: renders the
# committed demonstration manifests the run reads (assets/demos/) where their frames are
# missing, then resumes `vlarun distill` in training/ceed-<run>/ for MINUTES minutes of this
# call; its 85-minute cosine is the whole run (resume in a later session with the same line).
#   scripts/distill-ceed.sh TEACHER [MINUTES] [THREADS]
# TEACHER: mt10p-fast (the pi0-FAST-shaped teacher; FAST blocks of 32 codes, window = its
# decode_tokens) or mt10p-llava (the LLaVA-VLA-shaped teacher, 20 action tokens).
# The recipe is mt10p-ar-ceed's third distillation (training/ceed-mt10p3/state.json): frames
# from the clean set and DAgger rounds 4 and 5, AR loss x3 on the teacher's fixed point.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER=${1:?TEACHER: mt10p-fast or mt10p-llava}
MINUTES=${2:-85}
THREADS=${3:-0}
export MUJOCO_GL=${MUJOCO_GL:-egl}
VLARUN=.venv/bin/vlarun
case "$TEACHER" in
  mt10p-fast) RUN=ceed-mt10pf; EXTRA=(--block 32 --window 0) ;;
  mt10p-llava) RUN=ceed-mt10pl; EXTRA=() ;;
  *) echo "TEACHER must be mt10p-fast or mt10p-llava, got $TEACHER" >&2; exit 2 ;;
esac
if [ ! -f "checkpoints/$TEACHER/config.json" ]; then
  echo "checkpoints/$TEACHER is missing: ship the teacher first (docs/checkpoints.md)" >&2
  exit 2
fi
SETS=()
for name in mt10p-clean mt10p-dagger4 mt10p-dagger5; do
  if [ ! -f "data/$name/manifest.json" ]; then
    "$VLARUN" demos --from-manifest "assets/demos/$name" --out "data/$name" --workers "$(nproc)"
  fi
  SETS+=("data/$name")
done
DEMOS=$(IFS=,; echo "${SETS[*]}")
exec "$VLARUN" distill --teacher "checkpoints/$TEACHER" --demos "$DEMOS" \
  --out "training/$RUN" --export "training/$RUN/export/$TEACHER-ceed" \
  --frames 6000 --init repeat --collect-batch 32 "${EXTRA[@]}" \
  --batch 16 --states 8 --initial-state --freeze-vision --lr 1.5e-4 --warmup 50 --omega 3 \
  --ar-target fixed-point --save-every 100 --log-every 10 --eval-frames 64 \
  --budget-minutes 85 --max-minutes "$MINUTES" --threads "$THREADS"
