#!/usr/bin/env bash
# resume_settings.sh GPT2_TRAIN WORKDIR: each checkpoint records the run's training settings, and
# --resume compares. A run saved with --lr 3e-3 and resumed with --lr 2e-3 is refused, naming
# each change, with nothing in the directory touched; with --resume-with-changes it continues
# under the new rate and says what changed, and its checkpoints record the new settings, which a
# plain --resume then keeps without a word. A run that reached its planned end may be trained on
# with more --steps (printed, not refused), but not under another lr.
TRAIN=$1 WORK=$2
set -u
mkdir -p "$WORK" && cd "$WORK" && rm -rf ./*
fail() {
  echo "FAIL: $*"
  exit 1
}
args=(--batch 4 --seq 16 --d-model 16 --heads 2 --layers 1 --sample-tokens 0 --progress lines --save ck)
snapshot() { (cd ck && find . -type f ! -name run.lock | sort | xargs md5sum); }

STRATA_FAULT=kill-at-step:5 "$TRAIN" "${args[@]}" --steps 6 --lr 3e-3 --save-every 2 > a.log 2>&1 && fail "the run was not killed"
grep -q '"lr": 0.003,' ck/step-00000004/manifest.json || fail "the manifest does not record the lr: $(cat ck/step-00000004/manifest.json)"
before=$(snapshot)

"$TRAIN" "${args[@]}" --steps 6 --lr 2e-3 --resume > refused.log 2>&1 && fail "resumed under another lr without --resume-with-changes"
grep -q "^resume:   lr: 0.003 -> 0.002$" refused.log || fail "the change was not printed: $(grep resume refused.log)"
grep -q "gpt2_train: error: resume: the training settings differ from those 'ck/step-00000004' was saved with (lr: 0.003 -> 0.002, min_lr: .* -> 0.0002), so the run would not continue as it was trained: resume with its settings, or allow the change (gpt2_train --resume-with-changes)" refused.log ||
  fail "no refusal naming the change: $(grep error refused.log)"
grep -q "^step " refused.log && fail "the refused run trained"
[ "$(snapshot)" = "$before" ] || fail "the refused resume changed the directory"

"$TRAIN" "${args[@]}" --steps 6 --lr 2e-3 --resume --resume-with-changes --metrics b.jsonl > changed.log 2>&1 ||
  fail "--resume-with-changes failed: $(tail -3 changed.log)"
grep -q "^resume:   lr: 0.003 -> 0.002$" changed.log || fail "the change was not printed: $(grep resume changed.log)"
grep -q "resume: continuing under the changed settings, as allowed" changed.log || fail "no word on continuing"
grep -q "resume: ck/step-00000004 (step 4" changed.log || fail "did not resume at step 4: $(grep resume changed.log)"
[ "$(grep -c '"step":' b.jsonl)" -eq 2 ] || fail "expected steps 5 and 6: $(cat b.jsonl)"
# The warm-up (all 6 steps) ends at the peak: the new one's (metrics count steps from 0).
grep -q '"step":5,"loss":[^,]*,"lr":0.002,' b.jsonl || fail "step 6 did not run at the new lr: $(tail -1 b.jsonl)"
grep -q '"lr": 0.002,' ck/step-00000006/manifest.json || fail "the new checkpoint does not record the new lr"

# The new settings are now the run's: a plain resume keeps them and says nothing.
"$TRAIN" "${args[@]}" --steps 6 --lr 2e-3 --resume > same.log 2>&1 || fail "a plain resume under the recorded settings failed"
grep -q "settings" same.log && fail "a resume under the recorded settings reported a change: $(grep settings same.log)"
# The run has reached the 6 steps it planned: training it on to 8 under another lr is refused
# (the steps to come would not be those of its settings), and so it leaves the directory as it was.
"$TRAIN" "${args[@]}" --lr 1e-3 --steps 8 --resume > longer_lr.log 2>&1 && fail "extended a finished run under another lr"
grep -q "gpt2_train: error: resume: the training settings differ .*lr: 0.002 -> 0.001" longer_lr.log ||
  fail "no refusal of the extension's lr: $(grep error longer_lr.log)"
# Only longer changes no step it had still to take: the longer schedule is printed and applies.
"$TRAIN" "${args[@]}" --lr 2e-3 --steps 8 --resume > longer.log 2>&1 || fail "extending a finished run was refused: $(grep error longer.log)"
grep -q "^resume:   total_steps: 6 -> 8$" longer.log && grep -q "^step    8/8" longer.log ||
  fail "the finished run was not extended, or silently: $(grep -E '^(resume|step)' longer.log)"
"$TRAIN" --steps 1 --resume-with-changes > flag.log 2>&1 && fail "--resume-with-changes without --resume was accepted"
grep -q "gpt2_train: error: gpt2_train: --resume-with-changes needs --resume" flag.log ||
  fail "wrong message: $(cat flag.log)"
echo "ok: a changed lr is refused by name, continues with --resume-with-changes, and is recorded"
