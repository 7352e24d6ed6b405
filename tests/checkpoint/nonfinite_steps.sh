#!/usr/bin/env bash
# nonfinite_steps.sh GPT2_TRAIN WORKDIR EXPECT_FAILURE: a non-finite gradient is never applied, in
# any precision. A learning rate of 1e30 wrecks the weights at step 1, so every later gradient is
# NaN: under fp32 and bf16 each such step is skipped and said so, the weights stay exactly those
# after step 1, and the tenth in a row stops the run; fp16 first backs its loss scale off to the
# minimum, then stops the same way.
set -eu
train=$1 work=$2 expect=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
small=(--batch 4 --seq 16 --d-model 32 --heads 2 --layers 2 --sample-tokens 0 --progress lines --lr 1e30 --warmup 0)
for p in fp32 bf16; do
  "$train" "${small[@]}" --precision $p --steps 1 --export one.safetensors > one.log
  "$train" "${small[@]}" --precision $p --steps 5 --export five.safetensors --metrics five.jsonl > five.log
  [ "$(grep -c 'update skipped, weights unchanged' five.log)" -eq 4 ] ||
    { echo "FAIL: $p: expected steps 2-5 skipped and said so"; grep "^step" five.log; exit 1; }
  [ "$(grep -c '"applied":false' five.jsonl)" -eq 4 ] || { echo "FAIL: $p: the metrics do not say the steps were skipped"; exit 1; }
  cmp one.safetensors five.safetensors || { echo "FAIL: $p: a skipped step changed the weights"; exit 1; }
  "$expect" "trainer: 10 steps in a row \(the last: step 11 of the run\) had a non-finite gradient norm \(-?nan\) and were skipped" \
    "$train" "${small[@]}" --precision $p --steps 30
done
"$expect" "trainer: 10 steps in a row \(the last: step 27 of the run\) had a non-finite gradient norm \(-?nan\) at the minimum loss scale" \
  "$train" "${small[@]}" --precision fp16 --steps 40
echo "ok: non-finite gradients are skipped in fp32, bf16 and fp16, and a run of them stops the run"
