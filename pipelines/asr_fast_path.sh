#!/usr/bin/env bash
# ASR fast path, end to end: vocab diet -> draft decoder -> Pareto sweep -> scoreboard.
# Every stage resumes where a kill left it (spoken examples and checkpoints in $WORK).
# Measured times on the 2-core dev machine are in the README ("ASR fast path").
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-whisper-base}
KEEP=${KEEP:-16000}
WORK=${WORK:-runs/fast_path}
PY=.venv/bin/python

# 1. Vocab diet: domain tokens kept, the rest re-spelled, recovered by distillation.
.venv/bin/audiofast distill --stage vocab --model "$MODEL" --keep "$KEEP" \
  --workdir "$WORK" --out "$WORK/$MODEL-diet$KEEP"
# 2. Draft decoder: two of the target's layers, distilled on its own transcripts.
.venv/bin/audiofast distill --stage drafter --model "$MODEL" \
  --workdir "$WORK" --out "$WORK/$MODEL-drafter"
# 3. The diet's speed/quality trade-off over several sizes (table + PNG).
$PY scripts/sweep_vocab_diet.py --models "$MODEL" --workdir "$WORK/sweep" \
  --out "$WORK/vocab_diet"
# 4. Scoreboard against faster-whisper on the same weights, threads and audio.
$PY scripts/bench_asr.py --models "$MODEL" --language en --runs 3 --window-pad 10 2 \
  --ct2 auto+pad2 pad2+batch8+chunk15 --fw-batch 8 \
  --fast int8 int8+ngram int8+pad2 int8+ngram+pad2 int8+model+pad2 int8+diet+model+pad2 \
  --draft-model "$WORK/$MODEL-drafter" --diet-model "$WORK/$MODEL-diet$KEEP" \
  --out "$WORK/bench_asr.json"
# 5. The judge: which configurations hold quality against 30 s CTranslate2 windows?
for CANDIDATE in "$MODEL+pad2" "$MODEL+auto+pad2" "$MODEL+pad2+batch8+chunk15" \
    "fast:$MODEL+pad2"; do
  .venv/bin/audiofast gate --lane asr --candidate "$CANDIDATE" --baseline "$MODEL" \
    --report-dir "$WORK/gate/$CANDIDATE" || echo "gate: $CANDIDATE did not pass"
done
