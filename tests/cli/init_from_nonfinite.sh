#!/usr/bin/env bash
# init_from_nonfinite.sh GPT2_TRAIN WORKDIR: --init-from refuses weights that are not finite. One
# NaN in a GPT-2 file (and then one infinity in a Llama file) is named - the tensor and its flat
# index - before a step runs or a checkpoint is written; every step would otherwise be skipped
# as non-finite and the poisoned weights saved as if trained.
set -eu
bin=$1; dir=$2
mkdir -p "$dir"; cd "$dir"; rm -rf ./*
shape=(--layers 1 --heads 2 --d-model 16 --seq 16 --batch 2 --sample-tokens 0)
fail() {
  echo "FAIL: $*"
  exit 1
}
# poke FILE TENSOR INDEX HEX: overwrites F32 element INDEX of TENSOR with the bytes HEX (little endian).
poke() {
  local file=$1 tensor=$2 index=$3 hex=$4 header_len header begin
  header_len=$(od -An -tu8 -N8 "$file" | tr -d ' ')
  header=$(dd if="$file" bs=1 skip=8 count="$header_len" status=none)
  begin=$(printf '%s' "$header" | sed -n "s/.*\"$tensor\":{[^}]*\"data_offsets\":\[\([0-9]*\),.*/\1/p")
  [ -n "$begin" ] || fail "no tensor $tensor in $file"
  printf "$hex" | dd of="$file" bs=1 seek=$((8 + header_len + begin + 4 * index)) conv=notrunc status=none
}
# refused NAME REGEX ARGS...: gpt2_train fails (not by a signal) with REGEX, trains and saves nothing.
refused() {
  local name=$1 regex=$2 rc=0; shift 2
  "$bin" "${shape[@]}" --steps 2 --save "ck_$name" "$@" > "$name.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "$name: exit $rc: $(tail -3 "$name.log")"
  grep -Eq -- "$regex" "$name.log" || fail "$name: no message matching $regex: $(grep error "$name.log")"
  grep -q "^step " "$name.log" && fail "$name: it trained"
  [ -z "$(ls "ck_$name"/step-* 2> /dev/null)" ] || fail "$name: a checkpoint was written"
}

"$bin" "${shape[@]}" --steps 1 --export gpt2.safetensors > gpt2.log || fail "export failed"
poke gpt2.safetensors transformer.h.0.mlp.c_fc.bias 5 '\000\000\300\177'  # NaN
refused gpt2_nan "gpt2_train: error: gpt2: '[^']*gpt2.safetensors': tensor 'transformer.h.0.mlp.c_fc.bias' holds nan at flat index 5 of its 64 values; weights must be finite numbers" \
  --init-from gpt2.safetensors

"$bin" --model llama "${shape[@]}" --steps 1 --export llama.safetensors > llama.log || fail "llama export failed"
poke llama.safetensors model.layers.0.self_attn.k_proj.weight 17 '\000\000\200\377'  # -inf
refused llama_inf "tensor 'model.layers.0.self_attn.k_proj.weight' holds -inf at flat index 17 of its 256 values" \
  --model llama --init-from llama.safetensors
echo "ok: a NaN and an infinity in --init-from weights are refused, naming the tensor and the index"
