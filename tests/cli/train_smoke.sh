#!/usr/bin/env bash
# train_smoke.sh GPT2_TRAIN WORKDIR: a short run writes one metrics line per step with every
# field, and the loss falls.
set -eu
bin=$1; dir=$2
mkdir -p "$dir"
"$bin" --steps 8 --batch 4 --seq 32 --d-model 32 --heads 2 --sample-tokens 20 --metrics "$dir/metrics.jsonl" > "$dir/out.txt"
lines=$(wc -l < "$dir/metrics.jsonl")
[ "$lines" -eq 8 ] || { echo "FAIL: $lines metrics lines, expected 8"; exit 1; }
for key in step loss lr grad_norm tokens_per_s mem; do
  grep -q "\"$key\":" "$dir/metrics.jsonl" || { echo "FAIL: metrics lack $key"; exit 1; }
done
grep -q '^sample:' "$dir/out.txt" || { echo "FAIL: no sample printed"; exit 1; }
first=$(head -1 "$dir/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
last=$(tail -1 "$dir/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }
echo "ok: loss $first -> $last over 8 steps"
