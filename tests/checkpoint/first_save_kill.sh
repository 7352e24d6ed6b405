#!/usr/bin/env bash
# first_save_kill.sh GPT2_TRAIN WORKDIR MPIEXEC NP_FLAG [FLAGS...]: a restart never needs a human.
#   1. Killed half-way through its first checkpoint (step 3 of a dp 2 run): only an incomplete
#      step-00000003/ exists. --resume removes it, says in one line that it starts at step 0, and
#      reproduces the uninterrupted run's losses bit for bit.
#   2. A complete checkpoint that fails to verify is still refused, not discarded: with only a
#      damaged complete one and an incomplete one, --resume stops naming why, and removes nothing.
TRAIN=$1 WORK=$2 MPIRUN="$3 $4"; shift 4; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
args=(--dp 2 --zero 1 --steps 6 --batch 8 --seq 32 --d-model 32 --heads 2 --layers 2 --vocab 259
      --sample-tokens 0 --progress lines)

run 2 full.log "${args[@]}" --metrics full.jsonl || fail "the uninterrupted run failed: $(tail -3 full.log)"

STRATA_FAULT=kill-during-save:3 run 2 killed.log "${args[@]}" --save ck --save-every 3 && fail "the run was not killed"
grep -q "STRATA_FAULT: killing this rank while writing its checkpoint shard" killed.log || fail "no fault message: $(tail -3 killed.log)"
[ -d ck/step-00000003 ] || fail "the first checkpoint's directory is not there"
[ -e ck/step-00000003/COMPLETE ] && fail "a checkpoint killed mid-save is marked complete"
[ "$(ls -d ck/step-* | wc -l)" -eq 1 ] || fail "expected only the incomplete step-00000003: $(ls ck)"

run 2 resumed.log "${args[@]}" --save ck --save-every 3 --resume --metrics resumed.jsonl || fail "resume failed: $(tail -3 resumed.log)"
grep -q "resume: removed 1 incomplete checkpoint in 'ck' (step-00000003: a run stopped while saving)" resumed.log ||
  fail "the incomplete checkpoint was not removed, or not said: $(grep resume resumed.log)"
[ "$(grep -c "resume: no complete checkpoint in 'ck' yet; starting at step 0" resumed.log)" -eq 1 ] ||
  fail "no one-line fresh-start message: $(grep resume resumed.log)"
[ "$(losses resumed.jsonl | wc -l)" -eq 6 ] || fail "the resumed run ran $(losses resumed.jsonl | wc -l) steps, expected 6"
same_losses full.jsonl resumed.jsonl
[ -e ck/step-00000003/COMPLETE ] && [ -e ck/step-00000006/COMPLETE ] || fail "the resumed run's checkpoints are not complete"

# 2. Step 6 made incomplete (as a crash before its marker), step 3 damaged: refused, nothing removed.
rm ck/step-00000006/COMPLETE
f=ck/step-00000003/rank-00000.safetensors
truncate -s -3 "$f"
run 2 refused.log "${args[@]}" --save ck --resume && fail "resumed from a damaged checkpoint"
grep -q "resume: skipping checkpoint file '$f' has .* (truncated)" refused.log || fail "the damage was not named: $(tail -3 refused.log)"
[ "$(grep -c "gpt2_train: error: resume: none of the 1 checkpoints in 'ck' can be loaded" refused.log)" -eq 2 ] ||
  fail "not every rank refused with the same words: $(grep error refused.log)"
[ -d ck/step-00000006 ] && [ -d ck/step-00000003 ] || fail "a refused resume removed checkpoints: $(ls ck)"
echo "ok: killed in its first save, the run restarts at step 0 by itself, bit for bit; damage is still refused"
