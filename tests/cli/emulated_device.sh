#!/usr/bin/env bash
# emulated_device.sh GPT2_TRAIN WORKDIR LAUNCH...: gpt2_train --device emulated (the GPU path's
# bookkeeping on the CPU) against the host; LAUNCH starts 2 ranks (mpiexec -n 2 ...).
#   1. tp 2 + SP on the host, 6 steps: the reference losses;
#   2. the same on the emulated device, saving at steps 3 and 6: the same losses bit for bit, and
#      each step moves only the batch in, the loss and the step's state out (4 copies: tokens,
#      targets, loss, and the norm and decision read once after the update);
#   3. with the step-6 checkpoint removed, the host resumes the emulated device's step-3
#      checkpoint, and steps 4-6 give the same losses bit for bit (a checkpoint written from
#      device memory resumes in host memory).
set -eu
bin=$1; dir=$2; shift 2
mkdir -p "$dir"; rm -rf "$dir"/ckpt "$dir"/*.txt "$dir"/*.jsonl
shape=(--layers 2 --heads 2 --d-model 32 --seq 32 --batch 4 --vocab 259 --steps 6 --sample-tokens 8 --progress lines
       --tp 2 --sp)
loss() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }

"$@" "$bin" "${shape[@]}" --metrics "$dir/host.jsonl" > "$dir/host.txt"
"$@" "$bin" "${shape[@]}" --device emulated --save "$dir/ckpt" --save-every 3 --metrics "$dir/emulated.jsonl" \
  > "$dir/emulated.txt"
if ! diff <(loss "$dir/host.jsonl") <(loss "$dir/emulated.jsonl"); then
  echo "FAIL: the emulated device's losses differ from the host's"; exit 1
fi
[ "$(loss "$dir/host.jsonl" | wc -l)" -eq 6 ] || { echo "FAIL: expected 6 steps"; cat "$dir/host.txt"; exit 1; }
grep -q "emulated memory: at most 4 copies between it and the host per step" "$dir/emulated.txt" \
  || { echo "FAIL: a step moved more than its batch, loss and state"; cat "$dir/emulated.txt"; exit 1; }
# Sampling on the emulated device draws the same tokens (its logits come back through the space).
[ "$(sed -n '/^sample:/,$p' "$dir/host.txt")" = "$(sed -n '/^sample:/,$p' "$dir/emulated.txt")" ] \
  || { echo "FAIL: the samples differ"; exit 1; }

rm -rf "$dir/ckpt/step-00000006"
"$@" "$bin" "${shape[@]}" --save "$dir/ckpt" --resume --metrics "$dir/resumed.jsonl" > "$dir/resumed.txt"
grep -q "resume: .*step-00000003 (step 3" "$dir/resumed.txt" || { echo "FAIL: did not resume at step 3"; cat "$dir/resumed.txt"; exit 1; }
if ! diff <(loss "$dir/host.jsonl" | tail -n 3) <(loss "$dir/resumed.jsonl"); then
  echo "FAIL: the host's resumed losses differ from the uninterrupted run's"; exit 1
fi
echo "ok: tp2+sp on the emulated device = host bit for bit, 4 copies per step; its checkpoint resumes on the host bit for bit"
