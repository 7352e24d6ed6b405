#!/usr/bin/env bash
# crash_resume.sh GPT2_TRAIN WORKDIR MPIEXEC NP_FLAG [FLAGS...]: a DP2 x TP2 run on four ranks
# killed by SIGKILL mid-training, and again in the middle of writing a checkpoint, resumes from
# the newest complete checkpoint and then reproduces the uninterrupted run's losses bit for bit.
# A bit-flipped and a truncated checkpoint file are refused, naming the file, and --resume falls
# back to the checkpoint before.
TRAIN=$1 WORK=$2 MPIRUN="$3 $4"; shift 4; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
args=(--dp 2 --tp 2 --zero 1 --steps 10 --batch 8 --seq 32 --d-model 32 --heads 2 --layers 2 --vocab 259
      --sample-tokens 0 --progress lines)

run 4 full.log "${args[@]}" --metrics full.jsonl || fail "the uninterrupted run failed: $(tail -3 full.log)"

# 1. Killed before step 8: checkpoints 3 and 6 are complete; the resumed run redoes 7-10.
STRATA_FAULT=kill-at-step:8 run 4 killed.log "${args[@]}" --save ck1 --save-every 3 && fail "the run was not killed"
grep -q "STRATA_FAULT: killing this rank before a step" killed.log || fail "no fault message: $(tail -3 killed.log)"
run 4 resumed.log "${args[@]}" --save ck1 --save-every 3 --resume --metrics resumed.jsonl ||
  fail "resume failed: $(tail -3 resumed.log)"
grep -q "resume: ck1/step-00000006 (step 6" resumed.log || fail "did not resume from step 6: $(grep resume resumed.log)"
same_losses full.jsonl resumed.jsonl

# 2. Killed half-way through writing its file of the step-6 checkpoint: that checkpoint has no
#    COMPLETE marker, so the run resumes from step 3.
STRATA_FAULT=kill-during-save:6@1 run 4 killed2.log "${args[@]}" --save ck2 --save-every 3 && fail "the run was not killed"
[ -e ck2/step-00000006/COMPLETE ] && fail "a checkpoint killed mid-save is marked complete"
[ -e ck2/step-00000006/rank-00001.safetensors.tmp ] || fail "the half-written file is not there"
run 4 resumed2.log "${args[@]}" --save ck2 --save-every 3 --resume --metrics resumed2.jsonl ||
  fail "resume after a crash mid-save failed: $(tail -3 resumed2.log)"
grep -q "resume: ck2/step-00000003 (step 3" resumed2.log || fail "did not fall back to step 3: $(grep resume resumed2.log)"
same_losses full.jsonl resumed2.jsonl

# 3. ck1 now holds steps 3, 6, 9 and 10. Flip one bit of step 10's rank 2 file and cut three
#    bytes off step 9's rank 1 file: both are refused by name, and step 6 is loaded.
f10=ck1/step-00000010/rank-00002.safetensors f9=ck1/step-00000009/rank-00001.safetensors
size=$(stat -c %s "$f10")
byte=$(od -An -tu1 -j $((size / 2)) -N1 "$f10" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 16)))" | dd of="$f10" bs=1 seek=$((size / 2)) conv=notrunc status=none
truncate -s -3 "$f9"
run 4 resumed3.log "${args[@]}" --save ck1 --save-every 3 --resume --metrics resumed3.jsonl ||
  fail "resume past damaged checkpoints failed: $(tail -3 resumed3.log)"
grep -q "skipping checkpoint file '$f10' has CRC-32 .* (corrupt)" resumed3.log || fail "the bit flip was not named"
grep -q "skipping checkpoint file '$f9' has .* (truncated)" resumed3.log ||
  fail "the truncation was not named"
grep -q "resume: ck1/step-00000006 (step 6" resumed3.log || fail "did not fall back to step 6: $(grep resume resumed3.log)"
same_losses full.jsonl resumed3.jsonl
echo "ok: crash, crash mid-save, bit flip and truncation all resume to the uninterrupted losses"
