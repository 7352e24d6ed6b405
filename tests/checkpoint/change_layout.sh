#!/usr/bin/env bash
# change_layout.sh GPT2_TRAIN WORKDIR MPIEXEC NP_FLAG TOLERANCE NP_A "FLAGS_A" NP_B "FLAGS_B" [MPI FLAGS...]
# A checkpoint saved at step 4 under layout A loads under layout B: the weights exactly (the
# export of the loaded model is byte for byte the one layout A exports from the same
# checkpoint), and the next two steps' losses match layout A's uninterrupted run within
# TOLERANCE (relative; the layouts sum in different orders). Step 6 needs the optimizer
# state, so it checks that the moments were re-sharded, not just the weights.
TRAIN=$1 WORK=$2 MPIRUN="$3 $4" tol=$5 np_a=$6 flags_a=$7 np_b=$8 flags_b=$9; shift 9; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
model=(--batch 8 --seq 32 --d-model 32 --heads 4 --layers 4 --vocab 258 --sample-tokens 0 --progress lines)
# shellcheck disable=SC2086
run "$np_a" a.log "${model[@]}" --steps 6 $flags_a --save ck --save-every 4 --metrics a.jsonl || fail "layout A: $(tail -3 a.log)"
rm -rf ck/step-00000006
# shellcheck disable=SC2086
run "$np_b" b.log "${model[@]}" --steps 6 $flags_b --save ck --resume --metrics b.jsonl || fail "layout B: $(tail -3 b.log)"
grep -q "resume: ck/step-00000004 (step 4" b.log || fail "layout B did not resume at step 4: $(grep resume b.log)"
[ "$(losses b.jsonl | wc -l)" -eq 2 ] || fail "layout B ran $(losses b.jsonl | wc -l) steps, expected 2"
join <(losses a.jsonl) <(losses b.jsonl) | awk -v tol="$tol" '
  { d = $2 - $3; if (d < 0) d = -d; rel = d / $2
    printf "step %d: layout A %s, layout B %s, relative difference %.2e\n", $1 + 1, $2, $3, rel
    if (rel > tol) bad = 1 }
  END { exit bad }' || fail "losses after the layout change differ by more than $tol"

# The weights of the step-4 checkpoint, exported by each layout without training further.
rm -rf ck/step-00000006
# shellcheck disable=SC2086
run "$np_a" ea.log "${model[@]}" $flags_a --steps 4 --save ck --resume --export a.safetensors || fail "export A: $(tail -3 ea.log)"
# shellcheck disable=SC2086
run "$np_b" eb.log "${model[@]}" $flags_b --steps 4 --save ck --resume --export b.safetensors || fail "export B: $(tail -3 eb.log)"
cmp a.safetensors b.safetensors || fail "the weights loaded under layout B differ from layout A's"
echo "ok: $flags_a ($np_a ranks) -> $flags_b ($np_b ranks): weights exact, next losses within $tol"
