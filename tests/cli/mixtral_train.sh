#!/usr/bin/env bash
# mixtral_train.sh GPT2_TRAIN WORKDIR LAUNCH...: gpt2_train --model mixtral end to end; LAUNCH is
# the command that starts 2 ranks (mpiexec -n 2 ...).
#   1. two pipeline stages train 6 steps of a 4-expert top-2 model, write metrics, save a checkpoint
#      and export MixtralForCausalLM names; the progress line and every metrics line carry the
#      auxiliary loss and each block's expert load; the loss falls;
#   2. two data-parallel ranks with expert parallelism (ep 2: each holds 2 of the 4 experts) resume
#      that checkpoint (another layout), reach step 8, save, and sample tokens (every rank
#      generating in step, the new tokens crossing the expert group);
#   3. one rank resumes the ep 2 checkpoint and reaches step 9;
#   4. one rank starts from the export (--init-from).
set -eu
bin=$1; dir=$2; shift 2
mkdir -p "$dir"; rm -rf "$dir"/ckpt "$dir"/*.txt "$dir"/*.jsonl "$dir"/*.safetensors
shape=(--model mixtral --layers 2 --heads 4 --kv-heads 2 --d-model 32 --ffn 32 --experts 4 --moe-top-k 2 --seq 32
       --batch 4 --lr 1e-3 --z-coef 0.001 --progress lines)
"$@" "$bin" "${shape[@]}" --sample-tokens 0 --steps 6 --pp 2 --microbatches 2 --save "$dir/ckpt" --metrics "$dir/m.jsonl" \
  --export "$dir/mixtral.safetensors" > "$dir/pp2.txt"
grep -q "gpt2_train: mixtral, 2 layers, 4 heads (2 key/value), 4 experts (top 2)" "$dir/pp2.txt" ||
  { echo "FAIL: no mixtral header"; cat "$dir/pp2.txt"; exit 1; }
grep -q "^step    6/6 .* | aux 0\.0[0-9]* | expert load max [0-9.]*x" "$dir/pp2.txt" ||
  { echo "FAIL: no auxiliary loss or expert load on the progress line"; cat "$dir/pp2.txt"; exit 1; }
grep -q "Hugging Face MixtralForCausalLM names" "$dir/pp2.txt" || { echo "FAIL: no export line"; cat "$dir/pp2.txt"; exit 1; }
[ "$(grep -c '"aux_loss":0\.0[0-9]*,"experts":\[{"block":0,.*{"block":1,' "$dir/m.jsonl")" = 6 ] ||
  { echo "FAIL: metrics lines without the auxiliary loss and both blocks' loads"; cat "$dir/m.jsonl"; exit 1; }
first=$(grep -m1 "^step" "$dir/pp2.txt" | sed 's/.*loss \([0-9.]*\).*/\1/')
last=$(grep "^step" "$dir/pp2.txt" | tail -1 | sed 's/.*loss \([0-9.]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }

"$@" "$bin" "${shape[@]}" --sample-tokens 4 --steps 8 --ep 2 --save "$dir/ckpt" --resume \
  > "$dir/resume.txt"
grep -q "resume: .*step-00000006 (step 6" "$dir/resume.txt" || { echo "FAIL: did not resume at step 6"; cat "$dir/resume.txt"; exit 1; }
grep -q "dp 2 (experts over ep 2), ZeRO-0" "$dir/resume.txt" || { echo "FAIL: not resumed under dp 2, ep 2"; cat "$dir/resume.txt"; exit 1; }
grep -q "step    8/8" "$dir/resume.txt" || { echo "FAIL: resumed run did not reach step 8"; exit 1; }
grep -q "^sample:" "$dir/resume.txt" && ! grep -q "^sample: skipped" "$dir/resume.txt" ||
  { echo "FAIL: no sample under ep 2"; cat "$dir/resume.txt"; exit 1; }

"$bin" "${shape[@]}" --sample-tokens 0 --steps 9 --save "$dir/ckpt" --resume > "$dir/resume1.txt"
grep -q "resume: .*step-00000008 (step 8" "$dir/resume1.txt" || { echo "FAIL: one rank did not resume the ep 2 checkpoint"; cat "$dir/resume1.txt"; exit 1; }
grep -q "step    9/9" "$dir/resume1.txt" || { echo "FAIL: one rank did not reach step 9"; exit 1; }

"$bin" "${shape[@]}" --sample-tokens 0 --steps 1 --init-from "$dir/mixtral.safetensors" > "$dir/init.txt"
grep -q "init-from: .*mixtral.safetensors" "$dir/init.txt" || { echo "FAIL: init-from"; cat "$dir/init.txt"; exit 1; }
echo "ok: mixtral trains on 2 stages, resumes under dp 2 x ep 2 and on one rank, samples under ep 2, exports and loads its weights"
