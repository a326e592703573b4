#!/usr/bin/env bash
# Debian packages vlarun needs: a venv-capable Python, (for the Meta-World benchmark)
# OSMesa/EGL to render MuJoCo headless, and Chromium, the real browser the edge dashboard's
# test renders the page in. Installs only what is missing; needs root or sudo then.
set -euo pipefail
want=(python3-venv python3-dev libosmesa6 libegl1 libgl1 chromium)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# python3-venv is only a Debian split: a Python with a working ensurepip does not need it.
if python3 -c "import ensurepip, venv" 2>/dev/null; then
  missing=("${missing[@]/python3-venv}")
  missing=("${missing[@]/python3-dev}")
fi
read -r -a missing <<< "${missing[*]:-}"
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install-system: not a Debian system; please install: ${missing[*]}" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-system: apt-get install ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
