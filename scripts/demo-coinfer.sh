#!/usr/bin/env bash
# Co-inference demo: an edge server and a robot agent as separate processes on loopback.
# The link between them (a shaping relay) runs at 200 Mbit/s, drops to 2 Mbit/s at 5 s and
# recovers at 9 s (the three episodes take about 14 s, so the return is seen); the robot prints
# a summary per episode and one line on when its plans left the edge after the drop and came
# back after the restore (`--log`: one line per inference).
set -euo pipefail
VLARUN=${VLARUN:-.venv/bin/vlarun}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
out=$(mktemp)
"$VLARUN" serve-edge --port 0 --insecure --json --threads 1 >"$out" &
edge=$!
trap 'kill "$edge" 2>/dev/null; wait "$edge" 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 100); do grep -q endpoint "$out" && break; sleep 0.2; done
endpoint=$(head -1 "$out" | sed 's/.*"endpoint": "\([^"]*\)".*/\1/')
"$VLARUN" ping --edge "$endpoint" --insecure
"$VLARUN" run-robot --edge "$endpoint" --insecure --task drawer-open-v3 --episodes 3 \
  --robot-slowdown 2 --link-mbps 200 --link-schedule "5:2,9:200"
