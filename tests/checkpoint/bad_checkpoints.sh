#!/usr/bin/env bash
# bad_checkpoints.sh GPT2_TRAIN WORKDIR EXPECT_FAILURE: checkpoints that cannot be used end the
# run with a message naming why, never a signal and never a silent fresh start.
set -eu
train=$1 work=$2 expect=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
small=(--batch 4 --seq 16 --d-model 32 --heads 2 --sample-tokens 0 --progress lines)
"$train" "${small[@]}" --layers 2 --steps 2 --save ck > first.log
[ -e ck/step-00000002/COMPLETE ] || { echo "FAIL: no complete checkpoint at step 2"; exit 1; }

# Another model (3 layers), another seed, another precision.
"$expect" "checkpoint 'ck/step-00000002' is of another model: layers 2 there, 3 here" \
  "$train" "${small[@]}" --layers 3 --steps 3 --save ck --resume
"$expect" "was trained with seed 1337; this run has seed 5 \(the data order would change\)" \
  "$train" "${small[@]}" --layers 2 --seed 5 --steps 3 --save ck --resume
"$expect" "checkpoint 'ck/step-00000002' was saved in precision .*F32.*; this run uses .*BF16" \
  "$train" "${small[@]}" --layers 2 --precision bf16 --steps 3 --save ck --resume

# Every checkpoint damaged: refused by name, then an error rather than starting over.
cp -r ck ck_saved
printf 'garbage' > ck/step-00000002/manifest.json
"$expect" "skipping checkpoint manifest 'ck/step-00000002/manifest.json' does not match its COMPLETE marker" \
  "$train" "${small[@]}" --layers 2 --steps 3 --save ck --resume
"$expect" "resume: none of the 1 checkpoints in 'ck' can be loaded" "$train" "${small[@]}" --layers 2 --steps 3 --save ck --resume

# An empty directory is a fresh start, said so.
out=$("$train" "${small[@]}" --layers 2 --steps 1 --save empty --resume)
printf '%s\n' "$out" | grep -q "resume: no complete checkpoint in 'empty' yet; starting at step 0" ||
  { echo "FAIL: no fresh-start message"; exit 1; }
echo "ok: every bad checkpoint case ends with its message"
