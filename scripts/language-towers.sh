#!/bin/bash
# Regenerates docs/language-towers.md's measured sections (issue 18 item 2): the baseline tower,
# the MiniLM-L6 towers (k = 0 on 8,000 scenes, with and without training paraphrases; the two-stage
# runs on 3,000 scenes: stage 1 k = 0, stage 2 k = 2, k = 2 + paraphrases, k = 6, LoRA on the top 2
# layers) and the comparison table. About 4 hours on 2 idle CPU cores. SceneWorld synthetic data.
set -euo pipefail
cd "$(dirname "$0")/.."
LL=".venv/bin/python -m engine.cli dev"
T=build/lm-towers
DOC=docs/language-towers.md
ev() { $LL lexical-shift --text-tower "$T/$1" --section "lexical-shift-$1" --out $DOC --json-out "docs/lexical-shift-$1.json"; }
$LL lexical-shift --out $DOC --json-out docs/lexical-shift.json
$LL train-lm-tower --out $T/minilm-k0 && ev minilm-k0
$LL train-lm-tower --out $T/minilm-k0-para --paraphrase-train 1 && ev minilm-k0-para
$LL train-lm-tower --out $T/s1-k0 --n 3000 --val 500 --epochs 60 && ev s1-k0
S2=(--lm $T/s1-k0 --n 3000 --val 500 --epochs 4 --lr 2e-4 --warmup-steps 4 --sentence-sampling 0.6)
$LL train-lm-tower --out $T/s2-k2 "${S2[@]}" --train-layers 2 --lm-lr 1e-4 && ev s2-k2
$LL train-lm-tower --out $T/s2-k2-para "${S2[@]}" --train-layers 2 --lm-lr 1e-4 --paraphrase-train 1 && ev s2-k2-para
$LL train-lm-tower --out $T/s2-k6 "${S2[@]}" --train-layers 6 --lm-lr 1e-4 && ev s2-k6
$LL train-lm-tower --out $T/s2-lora2 "${S2[@]}" --lora-layers 2 --lora-rank 8 --lm-lr 1e-3 && ev s2-lora2
compare=("sceneworld-mini tower=docs/lexical-shift.json" "k=0, 8,000 scenes=docs/lexical-shift-minilm-k0.json"
         "stage 1: k=0=docs/lexical-shift-s1-k0.json" "stage 2: k=2=docs/lexical-shift-s2-k2.json"
         "stage 2: k=2 + paraphrase=docs/lexical-shift-s2-k2-para.json" "stage 2: k=6=docs/lexical-shift-s2-k6.json"
         "stage 2: LoRA top 2=docs/lexical-shift-s2-lora2.json")
$LL lexical-shift --compare "${compare[@]}" --out $DOC
