#!/usr/bin/env bash
# init_from_positions.sh GPT2_TRAIN WORKDIR: weights with more positions than --seq load by
# cropping the position table, and flag checks that need no I/O come before the weights load.
#   1. a --seq 1024 run (tiny width) exports GPT-2 weights with a 1024-position table;
#   2. a --seq 128 run starts from them: it says it crops (one line) and trains;
#   3. --seq 2048 is refused, naming both numbers;
#   4. --data matching no file, and --vocab < 256 on the generated corpus, fail with their own
#      message before any init-from line (the weights are not read first).
set -eu
bin=$1; dir=$2
mkdir -p "$dir"; rm -f "$dir"/*.txt "$dir"/*.safetensors
shape=(--layers 1 --heads 2 --d-model 16 --batch 2 --sample-tokens 0)
file="$dir/pos1024.safetensors"
"$bin" "${shape[@]}" --seq 1024 --steps 1 --export "$file" > "$dir/export.txt"
grep -q "export: .*pos1024.safetensors" "$dir/export.txt" || { echo "FAIL: no export"; cat "$dir/export.txt"; exit 1; }

"$bin" "${shape[@]}" --seq 128 --steps 3 --init-from "$file" > "$dir/crop.txt"
grep -q "^init-from: .*pos1024.safetensors" "$dir/crop.txt" || { echo "FAIL: no init-from line"; cat "$dir/crop.txt"; exit 1; }
grep -qx "init-from: wpe has 1024 positions, using the first 128 (--seq 128)" "$dir/crop.txt" \
  || { echo "FAIL: no crop line"; cat "$dir/crop.txt"; exit 1; }
grep -q "seq 128" "$dir/crop.txt" && grep -q "step    3/3" "$dir/crop.txt" || { echo "FAIL: did not train"; cat "$dir/crop.txt"; exit 1; }

if "$bin" "${shape[@]}" --seq 2048 --steps 1 --init-from "$file" > "$dir/long.txt" 2>&1; then
  echo "FAIL: --seq 2048 loaded a 1024-position file"; exit 1
fi
grep -q "tensor 'transformer.wpe.weight' has 1024 positions, fewer than --seq 2048" "$dir/long.txt" \
  || { echo "FAIL: wrong refusal of --seq 2048"; cat "$dir/long.txt"; exit 1; }

# Each must fail (non-zero, not a signal) with its message, and print no init-from line.
refuse() {
  local name=$1 regex=$2; shift 2
  local rc=0
  "$bin" "${shape[@]}" --steps 1 --init-from "$file" "$@" > "$dir/$name.txt" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || { echo "FAIL: $name: exit $rc"; cat "$dir/$name.txt"; exit 1; }
  grep -Eq -- "$regex" "$dir/$name.txt" || { echo "FAIL: $name: no message matching $regex"; cat "$dir/$name.txt"; exit 1; }
  if grep -q "init-from" "$dir/$name.txt"; then echo "FAIL: $name: the weights loaded first"; cat "$dir/$name.txt"; exit 1; fi
}
refuse missing_data "no token shard matches '/nonexistent/\*\.bin'" --seq 1024 --data '/nonexistent/*.bin'
refuse small_vocab "the generated corpus is byte-level and needs --vocab >= 256, got 100" --seq 1024 --vocab 100
echo "ok: 1024 positions cropped to --seq 128 and trained; --seq 2048 refused; data flags checked before the weights"
