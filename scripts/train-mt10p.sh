#!/usr/bin/env bash
# Continue training the mt10p policies (issue 48) from the repository, on any machine:
# renders the committed demonstration manifests (assets/demos/) where their frames are missing,
# then resumes `vlarun train` from training/mt10p/ (the committed state) for MINUTES minutes.
# Commit training/mt10p/state.* and train.log when it stops (they replace the last ones), and
# only then: the state is rewritten every 20 minutes, and each commit of it is 23 MB of history
# (while it runs, commit with `git add -A -- ':!training'`).
#   scripts/train-mt10p.sh [MINUTES] [THREADS]     (default 90 minutes, every core)
# SUITE=mt10g trains the labelled goal-in-state variant (issue 48, step 6: the goal xyz in the
# state, Meta-World's own MT observation) on the same demonstrations, into training/mt10g/,
# starting from the mt10p run's weights (the proprio input widened with zero columns).
# SUITE=mt10p2 fine-tunes the image-only mt10p run (same shape, same inputs) on every committed
# set, DAgger rounds 1 and 2 included (the mt10p run saw clean + DART only), into
# training/mt10p2/: a cosine timed to end within one 85-minute stretch.
# SUITE=mt10p3 fine-tunes the mt10p2 run again with DAgger round 3 added, twice as many batches
# from each precise task (reach, push, pick-place, peg-insert-side) as from any other task,
# into training/mt10p3/ (85 minutes).
# SUITE=mt10p5 fine-tunes mt10p4 the same way with DAgger round 4 (assets/demos/mt10p-dagger4)
# added, for 85 minutes.
# SUITE=mt10p6 (the next stretch, not run yet) fine-tunes mt10p5 with the DiT and flow losses
# weighed 10 and 5 (--loss-weights): they are 10-30x smaller than the AR cross-entropy, so the
# shared trunk serves the token heads; AR and OFT may ship from the run before it. Its data adds
# DAgger round 5 (assets/demos/mt10p-dagger5: 200 episodes, 22,790 frames, seeds 9200+, driven
# by the shipped mt10p-dit, where DiT fails: peg-insert 0%, pick-place 28%).
# SUITE=mt10pf trains mt10p-fast (issue 65: the pi0-FAST-shaped teacher for CEED), from mt10p5.
# SUITE=mt10pl trains mt10p-llava (issue 65: LLaVA-VLA's shape, a CLIP tower and 20 action
# tokens per inference), from mt10p5.
# SUITE=mt10p4 fine-tunes mt10p3 with 2 cm of noise on the hand position of every training
# state (--state-noise 0.02): the mt10p policies copy the hand's displacement from its fixed
# start (causal confusion: +5 cm of hand x in the state, same image, moves reach's x action by
# +0.8 where the expert's moves -0.25), so the goal in the image goes unused. From its 37th
# minute on, 30% of each task's samples come from the first 8 frames of its episodes
# (--early-share 0.3), where the hand sits at its fixed start and only the image says where the
# goal is; the cosine stretched to 105 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-90}
THREADS=${2:-0}
export MUJOCO_GL=${MUJOCO_GL:-egl}
VLARUN=.venv/bin/vlarun
SETS=()
for m in assets/demos/mt10p-*/; do
  name=$(basename "$m")
  if [ ! -f "data/$name/manifest.json" ]; then
    "$VLARUN" demos --from-manifest "$m" --out "data/$name" --workers "$(nproc)"
  fi
  SETS+=("data/$name")
done
DEMOS=$(IFS=,; echo "${SETS[*]}")
SUITE=${SUITE:-mt10p}
# What every mt10p-fast and mt10p-llava stretch shares (the mt10p5 / mt10p6 recipe: 85 minutes,
# noisy hand state, episode starts, the precise tasks weighted 2).
FAST=(--steps 8000 --budget-minutes 85 --state-noise 0.02 --early-share 0.3
      --task-weights reach-v3=2,push-v3=2,pick-place-v3=2,peg-insert-side-v3=2)
case "$SUITE" in
  mt10p) SCHEDULE=(--steps 12000 --lr 3e-4 --warmup 300) ;;
  # A fine-tune of a trained trunk: a quarter of the schedule at a third of the peak LR.
  mt10g) SCHEDULE=(--steps 4000 --lr 1e-4 --warmup 100 --init-from training/mt10p) ;;
  mt10p2) SUITE=mt10p SCHEDULE=(--out training/mt10p2 --steps 8000 --lr 1.5e-4 --warmup 100
                   --budget-minutes 85 --init-from training/mt10p) ;;
  mt10p3) SUITE=mt10p SCHEDULE=(--out training/mt10p3 --steps 8000 --lr 1.5e-4 --warmup 100
                   --budget-minutes 85 --init-from training/mt10p2
                   --task-weights reach-v3=2,push-v3=2,pick-place-v3=2,peg-insert-side-v3=2) ;;
  mt10p4) SUITE=mt10p SCHEDULE=(--out training/mt10p4 --steps 8000 --lr 2e-4 --warmup 100
                   --budget-minutes 105 --init-from training/mt10p3 --state-noise 0.02
                   --early-share 0.3
                   --task-weights reach-v3=2,push-v3=2,pick-place-v3=2,peg-insert-side-v3=2) ;;
  mt10p5) SUITE=mt10p SCHEDULE=(--out training/mt10p5 --steps 8000 --lr 2e-4 --warmup 100
                   --budget-minutes 85 --init-from training/mt10p4 --state-noise 0.02
                   --early-share 0.3
                   --task-weights reach-v3=2,push-v3=2,pick-place-v3=2,peg-insert-side-v3=2) ;;
  mt10p6) SUITE=mt10p SCHEDULE=(--out training/mt10p6 --steps 8000 --lr 2e-4 --warmup 100
                   --budget-minutes 85 --init-from training/mt10p5 --state-noise 0.02
                   --early-share 0.3 --loss-weights dit=10,flow=5
                   --task-weights reach-v3=2,push-v3=2,pick-place-v3=2,peg-insert-side-v3=2) ;;
  # Issue 65: pi0-FAST's output on the mt10p trunk (the mt10p-fast preset: FAST codes of
  # 8-step chunks, END-terminated), fine-tuned from mt10p5 (the run the shipped mt10p-ar came
  # from) on every committed set as mt10p6 was; its FAST vocabulary is fitted on the run's own
  # chunks at the start (training/mt10pf/fast_tokenizer/, committed with the state).
  mt10pf) SCHEDULE=(--out training/mt10pf --lr 2e-4 --warmup 200 --init-from training/mt10p5
                   "${FAST[@]}") ;;
  # The second stretch of mt10p-fast (run 2026-12-06 17:59-19:24 UTC, 102,304 samples; the
  # shipped mt10p-fast, 86.4% on MT10 x 25): continues mt10pf's weights and FAST ids, a cosine
  # of its own. Its student (CEED on the FAST backbone) is the next step, not a third stretch.
  mt10pf2) SUITE=mt10pf SCHEDULE=(--out training/mt10pf2 --lr 1.5e-4 --warmup 100
                    --init-from training/mt10pf "${FAST[@]}") ;;
  # Issue 65: LLaVA-VLA's shape on the mt10p trunk (the mt10p-llava preset: a CLIP tower of the
  # SigLIP tower's size, its second-to-last layer's patch tokens, 5-step chunks of 256-bin
  # tokens), fine-tuned from mt10p5 on every committed set as mt10pf was. The LM, projector and
  # proprio and auxiliary heads come over by name; the CLIP tower starts from mt10p5's SigLIP
  # tower (its class token and pre-LN fresh, as the init line in state.json and the card say).
  mt10pl) SCHEDULE=(--out training/mt10pl --lr 2e-4 --warmup 200 --init-from training/mt10p5
                   "${FAST[@]}") ;;
  *) echo "SUITE must be mt10p, mt10g, mt10pf, mt10pf2, mt10pl or mt10p2..mt10p6, got $SUITE" >&2
     exit 2 ;;
esac
exec "$VLARUN" train --suite "$SUITE" --demos "$DEMOS" --batch 32 "${SCHEDULE[@]}" \
  --max-minutes "$MINUTES" --threads "$THREADS" --save-minutes 20
