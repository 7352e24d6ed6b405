#!/usr/bin/env bash
# generate_greedy.sh GPT2_TRAIN WORKDIR LAUNCH...: gpt2_train's sample at the end of training, greedy
# from a text prompt, is the prompt followed by new tokens, and is the same on one rank and under
# tp 2 + SP on two (LAUNCH starts 2 ranks).
set -eu
bin=$1; dir=$2; shift 2
mkdir -p "$dir"
run=(--layers 2 --heads 2 --d-model 32 --seq 32 --batch 4 --steps 20 --progress lines --prompt "Once " --temperature 0
     --sample-tokens 24)
"$bin" "${run[@]}" > "$dir/serial.txt"
"$@" "$bin" "${run[@]}" --tp 2 --sp > "$dir/tp2.txt"
serial=$(sed -n '/^sample:/,$p' "$dir/serial.txt") tp2=$(sed -n '/^sample:/,$p' "$dir/tp2.txt")
printf '%s\n' "$serial"
printf '%s\n' "$serial" | sed -n 2p | grep -q "^Once " || { echo "FAIL: the sample does not start with the prompt"; exit 1; }
# One character per token (a newline token too), then the line's end.
[ "$(printf '%s\n' "$serial" | tail -n +2 | wc -c)" -eq $((5 + 24 + 1)) ] || { echo "FAIL: expected 24 new tokens"; exit 1; }
[ "$serial" = "$tp2" ] || { echo "FAIL: tp 2 + SP generated other tokens:"; printf '%s\n' "$tp2"; exit 1; }
echo "ok: greedy continuation of the prompt, the same under tp 2 + SP"
