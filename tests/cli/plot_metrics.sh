#!/usr/bin/env bash
# plot_metrics.sh GPT2_TRAIN PLOT_METRICS WORKDIR: the metrics lines carry FLOP/s, MFU (null
# without --hw, a fraction with it) and skipped steps, and plot-metrics turns them into a PNG.
set -eu
bin=$1; plot=$2; dir=$3
mkdir -p "$dir"
rm -f "$dir/metrics.png"
args=(--steps 4 --batch 4 --seq 32 --d-model 32 --heads 2 --sample-tokens 0)
"$bin" "${args[@]}" --metrics "$dir/metrics.jsonl" > /dev/null
"$bin" "${args[@]}" --metrics "$dir/metrics_hw.jsonl" --hw h100_80gb > /dev/null

num='[0-9][0-9.e+-]*'
[ "$(grep -c "\"flops_per_s\":$num,\"mfu\":null,.*\"skipped_steps\":0," "$dir/metrics.jsonl")" -eq 4 ] ||
  { echo "FAIL: without --hw every line needs a number flops_per_s, mfu null, skipped_steps 0"; head -1 "$dir/metrics.jsonl"; exit 1; }
[ "$(grep -c "\"flops_per_s\":$num,\"mfu\":$num," "$dir/metrics_hw.jsonl")" -eq 4 ] ||
  { echo "FAIL: with --hw every line needs a number mfu"; head -1 "$dir/metrics_hw.jsonl"; exit 1; }
# 17 significant digits: the loss reads back exactly (the first step's loss is not a short decimal).
grep -qE '"loss":[0-9]\.[0-9]{15,16},' "$dir/metrics.jsonl" || { echo "FAIL: loss not written to 17 digits"; exit 1; }

"$plot" "$dir/metrics.jsonl" "$dir/metrics.png"
[ "$(head -c 8 "$dir/metrics.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  { echo "FAIL: $dir/metrics.png lacks the PNG signature"; exit 1; }
size=$(wc -c < "$dir/metrics.png")
[ "$size" -gt 10000 ] || { echo "FAIL: $dir/metrics.png is only $size bytes"; exit 1; }
echo "ok: metrics carry flops_per_s, mfu, skipped_steps; plot-metrics wrote a $size-byte PNG"
