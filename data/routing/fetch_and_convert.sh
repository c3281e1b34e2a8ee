#!/usr/bin/env bash
# Fetch the public routing files named in docs/ROUTING.md and convert them with `npumoe-lab routing-import`.
# Usage: data/routing/fetch_and_convert.sh [SRC]
#   SRC: a folder holding git clones as OWNER+NAME/repo (default: clone them from GitHub into a temporary folder).
# Writes data/routing/{qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b} (shipped: licences allow it) and
# data/routing/mixtral-8x7b-humaneval (not shipped: the source repository grants no licence; git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
NPUMOE=${NPUMOE:-npumoe-lab}

repo() {   # repo OWNER/NAME -> a git dir holding it
  local d="$SRC/${1/\//+}/repo"
  if [ -n "$SRC" ] && [ -d "$d" ]; then echo "$d"; return; fi
  d="$TMP/${1/\//+}"
  [ -d "$d" ] || git clone -q --bare --filter=blob:none "https://github.com/$1" "$d"
  echo "$d"
}
get() {    # get OWNER/NAME COMMIT PATH DEST
  git -C "$(repo "$1")" show "$2:$3" > "$4"
}

OLMOE=357454f4f647385839c0ff6b99a688dc7cd9c13f
MBOLT=e7e9dbf770b6b7171f47a42173dfcf01c083d819
SPEC=216e26eb
mkdir -p "$TMP/olmoe" "$TMP/mixtral"
for d in arxiv book c4 github wikipedia tulu; do
  get allenai/OLMoE $OLMOE scripts/routing_output/olmoe/expert_counts/$d.pkl "$TMP/olmoe/$d.pkl"
done
for d in arxiv book c4 github wikipedia; do
  get allenai/OLMoE $OLMOE scripts/routing_output/mistral/expert_counts/$d.pkl "$TMP/mixtral/$d.pkl"
done
get doramirdor/mbolt $MBOLT results/colibri-119/coactivation_qwen3-30b-a3b.json "$TMP/qwen3.json"
get Mario928/speculative-moe $SPEC analysis/deep_analysis/routing_raw.jsonl "$TMP/humaneval.jsonl"

OL="https://github.com/allenai/OLMoE/tree/$OLMOE/scripts/routing_output"
TEXT="102 sequences x 2048 tokens per domain (arxiv, book = b3g, c4, github = github_oss_with_stack, wikipedia"
$NPUMOE routing-import --format olmoe-expert-counts "$TMP"/olmoe/{arxiv,book,c4,github,wikipedia,tulu}.pkl \
  --model-geometry olmoe-1b-7b --out data/routing/olmoe-1b-7b --phase prefill --model allenai/OLMoE-1B-7B-0924 \
  --tool-version "allenai/OLMoE@$OLMOE scripts/run_routing_analysis.py" --text "$TEXT, tulu)" \
  --licence "Apache-2.0 (allenai/OLMoE)" --source "$OL/olmoe/expert_counts" \
  --note "layers 0, 7 and 15 of 16 only" --note "prefill routing of 2048-token sequences, counts only"
$NPUMOE routing-import --format olmoe-expert-counts "$TMP"/mixtral/{arxiv,book,c4,github,wikipedia}.pkl \
  --model-geometry mixtral-8x7b --out data/routing/mixtral-8x7b --phase prefill --model mistralai/Mixtral-8x7B-v0.1 \
  --tool-version "allenai/OLMoE@$OLMOE scripts/run_routing_analysis.py" --text "$TEXT)" \
  --licence "Apache-2.0 (allenai/OLMoE)" --source "$OL/mistral/expert_counts" \
  --note "layers 0, 7 and 15 of 32 only (the script's fixed indices)" --note "prefill routing of 2048-token sequences, counts only"
$NPUMOE routing-import --format mbolt-coactivation "$TMP/qwen3.json" --model-geometry qwen3-30b-a3b \
  --out data/routing/qwen3-30b-a3b --domain dolly-codealpaca --phase decode --model Qwen/Qwen3-30B-A3B \
  --tool-version "doramirdor/mbolt@$MBOLT (llama.cpp routing trace)" \
  --text "200 prompts (120 Dolly + 80 CodeAlpaca), 75,773 decode tokens pooled" \
  --licence "MIT, Copyright (c) 2026 Dor Amir (doramirdor/mbolt)" \
  --source "https://github.com/doramirdor/mbolt/blob/$MBOLT/results/colibri-119/coactivation_qwen3-30b-a3b.json" \
  --note "decode-only counts pooled over 200 prompts (pooling flattens per-prompt hot sets); no prefill, no per-token structure" \
  --note "one domain (a Dolly + CodeAlpaca mix): cannot measure a calibration-vs-workload overlap"
$NPUMOE routing-import --format speculative-moe-jsonl "$TMP/humaneval.jsonl" --model-geometry mixtral-8x7b \
  --out data/routing/mixtral-8x7b-humaneval --model "Mixtral-8x7B-Instruct-v0.1 FP8 (vLLM)" \
  --tool-version "Mario928/speculative-moe@$SPEC analysis/deep_analysis/routing_raw.jsonl" \
  --text "HumanEval problem 0: its prompt (prefill) and 134 generated tokens" --quantisation FP8 \
  --licence "none granted (README: 'Research project for academic purposes'): not redistributed" \
  --source "https://github.com/Mario928/speculative-moe/blob/$SPEC/analysis/deep_analysis/routing_raw.jsonl" \
  --note "one problem of one benchmark: 78-84 prompt tokens and up to 134 decode tokens per layer" \
  --note "some tokens are not logged at some layers (204-218 per layer)"
