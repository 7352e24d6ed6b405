#!/usr/bin/env bash
# disk_full.sh GPT2_TRAIN WORKDIR VERIFY MPIEXEC NP_FLAG [FLAGS...]: a dp 2 run whose step-6 save
# meets a full disk (STRATA_FAULT=disk-full-during-save: rank 1's write fails half-way with
# ENOSPC) stops with the reason on every rank and leaves no partial file behind - on a full disk
# that file would hold the very space a restart needs. The same command with --resume, no one
# touching the directory, removes the unfinished step 6, continues from step 3 and matches the
# uninterrupted run bit for bit; every checkpoint left verifies.
TRAIN=$1 WORK=$2 VERIFY=$3 MPIRUN="$4 $5"; shift 5; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
args=(--dp 2 --steps 8 --batch 4 --seq 16 --d-model 16 --heads 2 --layers 1 --sample-tokens 0 --progress lines)

run 2 full.log "${args[@]}" --metrics full.jsonl || fail "the uninterrupted run failed: $(tail -3 full.log)"

STRATA_FAULT=disk-full-during-save:6@1 run 2 full_disk.log "${args[@]}" --save ck --save-every 3 &&
  fail "the run went on past a save that failed"
grep -q "checkpoint: rank 1: writing 'ck/step-00000006/rank-00001.safetensors.tmp' failed: No space left on device" \
  full_disk.log || fail "rank 1 did not say why its write failed: $(grep -i checkpoint full_disk.log)"
[ "$(grep -c "gpt2_train: error: checkpoint: rank 1 could not write its file in 'ck/step-00000006'" full_disk.log)" -eq 2 ] ||
  fail "expected the failed save on both ranks: $(grep error full_disk.log)"
leftover=$(find ck -name '*.tmp')
[ -z "$leftover" ] || fail "the failed write left its temporary file: $leftover"
[ -e ck/step-00000003/COMPLETE ] && [ ! -e ck/step-00000006/COMPLETE ] ||
  fail "expected a complete step 3 and an unfinished step 6: $(ls ck ck/step-00000006)"

run 2 resumed.log "${args[@]}" --save ck --save-every 3 --resume --metrics resumed.jsonl ||
  fail "the resume after a full disk failed: $(tail -3 resumed.log)"
grep -q "resume: removed 1 incomplete checkpoint in 'ck' (step-00000006" resumed.log ||
  fail "the unfinished save was not cleared: $(grep resume resumed.log)"
grep -q "resume: ck/step-00000003 (step 3" resumed.log || fail "did not resume from step 3: $(grep resume resumed.log)"
same_losses full.jsonl resumed.jsonl
"$VERIFY" ck || fail "a checkpoint left does not verify"
echo "ok: a save on a full disk leaves no partial file, and the plain resume continues bit for bit"
