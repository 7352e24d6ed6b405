#!/usr/bin/env bash
# run_identity.sh GPT2_TRAIN WORKDIR MPIEXEC NP_FLAG [FLAGS...]: a checkpoint directory is never
# shared by two runs. The first save writes DIR/run.json (a random run id, the model, precision
# and seed); a run that does not resume is refused there, and so is a resume of another model or
# seed - at start-up, on every rank with the same words, before anything is written or deleted.
# A resume under another layout is the same run (layout is not part of the identity).
TRAIN=$1 WORK=$2 MPIRUN="$3 $4"; shift 4; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
args=(--batch 8 --seq 32 --d-model 32 --heads 2 --vocab 259 --sample-tokens 0 --progress lines)
snapshot() { (cd "$1" && find . -type f | sort | xargs md5sum); }
# refused LOG PATTERN: both ranks failed, each with the same one line, matching PATTERN.
refused() {
  local lines
  lines=$(grep "gpt2_train: error:" "$1" | sort | uniq -c)
  [ "$(printf '%s\n' "$lines" | wc -l)" -eq 1 ] && printf '%s\n' "$lines" | grep -q "^ *2 " ||
    fail "$1: expected one identical error line from each of the 2 ranks, got: $lines"
  printf '%s\n' "$lines" | grep -Eq -- "$2" || fail "$1: the error does not match '$2': $lines"
}

run 2 a.log "${args[@]}" --steps 4 --layers 2 --dp 2 --save ck --save-every 2 || fail "run A failed: $(tail -3 a.log)"
[ -e ck/run.json ] || fail "the first save wrote no run.json"
id=$(sed -n 's/.*"run": "\([0-9a-f]*\)".*/\1/p' ck/run.json)
[ ${#id} -eq 32 ] || fail "no 128-bit run id in run.json: $(cat ck/run.json)"
grep -q "\"run\": \"$id\"" ck/step-00000004/manifest.json || fail "the manifest does not name the run"
before=$(snapshot ck)

# Another run without --resume: the same flags, or another seed. Refused; nothing touched.
run 2 b.log "${args[@]}" --steps 4 --layers 2 --dp 2 --save ck --save-every 2 && fail "a second run wrote into run A's directory"
refused b.log "checkpoint directory 'ck' belongs to another run \(run $id, seed 1337, model .*\): resume that run \(gpt2_train --resume\), or save under another directory"
run 2 b2.log "${args[@]}" --steps 4 --layers 2 --dp 2 --seed 9 --save ck && fail "a run of another seed wrote into run A's directory"
refused b2.log "belongs to another run \(run $id, seed 1337"
# --resume with another seed or model.
run 2 c.log "${args[@]}" --steps 4 --layers 2 --dp 2 --seed 9 --save ck --resume && fail "resumed another seed's run"
refused c.log "the checkpoint in 'ck/step-00000004' was trained with seed 1337; this run has seed 9"
run 2 d.log "${args[@]}" --steps 4 --layers 3 --dp 2 --save ck --resume && fail "resumed another model's run"
refused d.log "checkpoint 'ck/step-00000004' is of another model: layers 2 there, 3 here"
[ "$(snapshot ck)" = "$before" ] || fail "a refused run changed the directory"

# The same run resumed under another layout (tp 2): accepted, same id, two more steps.
run 2 e.log "${args[@]}" --layers 2 --steps 6 --tp 2 --save ck --save-every 2 --resume --metrics e.jsonl || fail "resume under tp 2 failed: $(tail -3 e.log)"
grep -q "resume: ck/step-00000004 (step 4" e.log || fail "did not resume at step 4: $(grep resume e.log)"
[ "$(losses e.jsonl | wc -l)" -eq 2 ] || fail "the resumed run trained $(losses e.jsonl | wc -l) steps, expected 2"
grep -q "\"run\": \"$id\"" ck/run.json ck/step-00000006/manifest.json || fail "the resumed run changed the run id"

# Killed in its first save: with no complete checkpoint, run.json still decides.
STRATA_FAULT=kill-during-save:2 run 2 k.log "${args[@]}" --steps 4 --layers 2 --dp 2 --save ck2 --save-every 2 && fail "the run was not killed"
[ -e ck2/run.json ] && [ -d ck2/step-00000002 ] || fail "expected run.json and an incomplete step-00000002: $(ls ck2)"
run 2 k2.log "${args[@]}" --steps 4 --layers 2 --dp 2 --seed 9 --save ck2 --resume && fail "resumed another seed's incomplete run"
refused k2.log "checkpoint directory 'ck2' belongs to another run \(run.json: run [0-9a-f]{32}\): it was trained with seed 1337; this run has seed 9"
run 2 k3.log "${args[@]}" --steps 4 --layers 3 --dp 2 --save ck2 --resume && fail "resumed another model's incomplete run"
refused k3.log "checkpoint directory 'ck2' belongs to another run \(run.json: run [0-9a-f]{32}\): it is of another model: layers 2 there, 3 here"
[ -d ck2/step-00000002 ] || fail "a refused resume removed the other run's incomplete checkpoint"

# Checkpoints with no run.json (an older strata's): a fresh start there is refused as well.
rm ck/run.json
run 2 f.log "${args[@]}" --steps 4 --layers 2 --dp 2 --save ck && fail "a fresh run wrote over checkpoints without a run.json"
refused f.log "checkpoint directory 'ck' already holds checkpoints of another run \(step-00000006, no run.json\)"
echo "ok: another run, seed or model is refused before anything is touched; a resume under another layout is the same run"
