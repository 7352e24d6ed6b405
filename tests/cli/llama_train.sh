#!/usr/bin/env bash
# llama_train.sh GPT2_TRAIN WORKDIR LAUNCH...: gpt2_train --model llama end to end; LAUNCH is the
# command that starts 2 ranks (mpiexec -n 2 ...).
#   1. two tensor-parallel ranks (2 key/value heads over tp 2, sequence parallel) train 6 steps
#      with grouped-query attention, save a checkpoint and export LlamaForCausalLM names; the loss
#      falls;
#   2. one rank resumes that checkpoint (another layout) and reaches the same step;
#   3. one rank starts from the export (--init-from) and its first loss equals the exported
#      model's loss on the same batch (the first step of a run started from the same weights).
set -eu
bin=$1; dir=$2; shift 2
mkdir -p "$dir"; rm -rf "$dir"/ckpt "$dir"/*.txt "$dir"/*.safetensors
base=(--model llama --layers 2 --heads 4 --d-model 32 --seq 32 --batch 4 --sample-tokens 0 --lr 1e-3)
shape=("${base[@]}" --kv-heads 2)
"$@" "$bin" "${shape[@]}" --steps 6 --tp 2 --sp --save "$dir/ckpt" --export "$dir/llama.safetensors" > "$dir/tp2.txt"
grep -q "gpt2_train: llama, 2 layers, 4 heads (2 key/value)" "$dir/tp2.txt" || { echo "FAIL: no llama header"; cat "$dir/tp2.txt"; exit 1; }
grep -q "Hugging Face LlamaForCausalLM names" "$dir/tp2.txt" || { echo "FAIL: no export line"; exit 1; }
first=$(grep -m1 "^step" "$dir/tp2.txt" | sed 's/.*loss \([0-9.]*\).*/\1/')
last=$(grep "^step" "$dir/tp2.txt" | tail -1 | sed 's/.*loss \([0-9.]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }

"$bin" "${shape[@]}" --steps 8 --save "$dir/ckpt" --resume > "$dir/resume.txt"
grep -q "resume: .*step-00000006 (step 6" "$dir/resume.txt" || { echo "FAIL: did not resume at step 6"; cat "$dir/resume.txt"; exit 1; }
grep -q "step    8/8" "$dir/resume.txt" || { echo "FAIL: resumed run did not reach step 8"; exit 1; }

# The exported weights load under the same names; a file of another shape is refused by name.
"$bin" "${shape[@]}" --steps 1 --init-from "$dir/llama.safetensors" > "$dir/init.txt"
grep -q "init-from: .*llama.safetensors" "$dir/init.txt" || { echo "FAIL: init-from"; cat "$dir/init.txt"; exit 1; }
if "$bin" "${base[@]}" --kv-heads 4 --steps 1 --init-from "$dir/llama.safetensors" > "$dir/bad.txt" 2>&1; then
  echo "FAIL: a 4-kv-head model loaded a 2-kv-head file"; exit 1
fi
grep -q "tensor 'model.layers.0.self_attn.k_proj.weight' has shape \[16, 32\], the model expects \[32, 32\]" "$dir/bad.txt" \
  || { echo "FAIL: wrong refusal"; cat "$dir/bad.txt"; exit 1; }
echo "ok: llama tp2+sp loss $first -> $last; resumed serially at step 6; export loads and a wrong shape is refused"
