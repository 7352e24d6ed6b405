#!/usr/bin/env bash
# cuda_matches_host.sh GPT2_TRAIN WORKDIR [LAUNCH...] (run only where a GPU is visible): the same
# short fp32 run on the host and on the GPU gives the same losses to 1e-4 relative (fp32 GEMMs
# without TF32; the kernels sum in other orders), for GPT-2 and for the Llama example
# (grouped-query), and a bf16 GPU run learns. With LAUNCH (a command starting 2 ranks), dp 2 with
# ZeRO-1, tp 2 + SP and pp 2 on the GPU(s) match the same layouts on the host likewise.
set -eu
bin=$1 dir=$2; shift 2
mkdir -p "$dir"; cd "$dir"
common=(--steps 5 --batch 4 --seq 64 --d-model 64 --heads 4 --layers 2 --sample-tokens 0 --progress lines)
"$bin" "${common[@]}" --precision fp32 --metrics host.jsonl > host.log
"$bin" "${common[@]}" --precision fp32 --device cuda --metrics cuda.jsonl > cuda.log
"$bin" --steps 30 --batch 8 --seq 64 --d-model 64 --heads 4 --layers 2 --progress lines --precision bf16 --device cuda \
  --metrics bf16.jsonl > bf16.log
"$bin" "${common[@]}" --model llama --kv-heads 2 --precision fp32 --metrics llama_host.jsonl > llama_host.log
"$bin" "${common[@]}" --model llama --kv-heads 2 --precision fp32 --device cuda --metrics llama_cuda.jsonl > llama_cuda.log
loss() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
same_losses() {
  join <(loss "$1") <(loss "$2") | awk '
    { d = $2 - $3; if (d < 0) d = -d; rel = d / $2
      printf "step %d: host %s, cuda %s, relative difference %.2e\n", $1, $2, $3, rel
      if (rel > 1e-4) bad = 1; n++ }
    END { exit bad || n != 5 }'
}
same_losses host.jsonl cuda.jsonl || { echo "FAIL: the GPU's fp32 GPT-2 losses differ from the host's"; exit 1; }
same_losses llama_host.jsonl llama_cuda.jsonl || { echo "FAIL: the GPU's fp32 Llama losses differ from the host's"; exit 1; }
for layout in "--dp 2 --zero 1" "--tp 2 --sp" "--pp 2 --microbatches 2"; do
  [ $# -gt 0 ] || break
  name=$(echo "$layout" | tr -d ' -')
  # shellcheck disable=SC2086
  "$@" "$bin" "${common[@]}" $layout --precision fp32 --metrics "host_$name.jsonl" > "host_$name.log"
  # shellcheck disable=SC2086
  "$@" "$bin" "${common[@]}" $layout --precision fp32 --device cuda --metrics "cuda_$name.jsonl" > "cuda_$name.log"
  same_losses "host_$name.jsonl" "cuda_$name.jsonl" || { echo "FAIL: $layout on the GPU differs from the host"; exit 1; }
done
first=$(loss bf16.jsonl | head -1 | cut -d' ' -f2) last=$(loss bf16.jsonl | tail -1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || { echo "FAIL: bf16 on the GPU did not learn ($first -> $last)"; exit 1; }
echo "ok: fp32 GPU losses match the host (GPT-2 and Llama); bf16 on the GPU $first -> $last"
