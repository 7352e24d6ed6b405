#!/usr/bin/env bash
# two_writers.sh GPT2_TRAIN WORKDIR VERIFY MPIEXEC NP_FLAG [FLAGS...]: two resumes of one run into
# one --save directory, started together - a scheduler's requeue while the old job still runs,
# or a user's resubmit. Both would take the run's id, and each delete the other's unfinished
# saves. Now one trains on and the other is refused at start-up, naming the holder's process id;
# every checkpoint left verifies (VERIFY: tests/checkpoint/verify_checkpoints.cpp). 20 times,
# with slow saves (STRATA_FAULT=slow-save) to widen the window in which two writers collide.
# Then a directory another process has locked refuses both ranks of a run with the same words.
TRAIN=$1 WORK=$2 VERIFY=$3 MPIRUN="$4 $5"; shift 5; MPI_AFTER_NP="$*"
. "$(dirname "$0")/common.sh"
rm -rf ./*
args=(--steps 5 --batch 4 --seq 16 --d-model 16 --heads 2 --layers 1 --sample-tokens 0 --progress lines)

"$TRAIN" "${args[@]}" --metrics full.jsonl > full.log 2>&1 || fail "the uninterrupted run failed: $(tail -3 full.log)"
STRATA_FAULT=kill-at-step:3 "$TRAIN" "${args[@]}" --save base --save-every 2 > base.log 2>&1 && fail "the run was not killed"
[ -e base/step-00000002/COMPLETE ] || fail "no checkpoint at step 2 to resume: $(ls base)"

# A trial counts when the two overlapped: one refused, or (if the first had ended before the
# second started) the second finding the run finished. Before the lock, both trained.
races=0 tries=0
while [ "$races" -lt 20 ]; do
  tries=$((tries + 1))
  [ "$tries" -le 40 ] || fail "only $races of $((tries - 1)) trials started the two runs together"
  d=ck$tries
  cp -r base "$d"
  STRATA_FAULT=slow-save:40 "$TRAIN" "${args[@]}" --save "$d" --save-every 1 --resume --metrics "$d.a.jsonl" \
    > "$d.a.log" 2>&1 &
  pa=$!
  STRATA_FAULT=slow-save:40 "$TRAIN" "${args[@]}" --save "$d" --save-every 1 --resume --metrics "$d.b.jsonl" \
    > "$d.b.log" 2>&1 &
  pb=$!
  wait "$pa"; ra=$?
  wait "$pb"; rb=$?
  if [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]; then
    # Not together: the later one must have found the run done and trained nothing.
    for x in a b; do
      grep -q "resume: $d/step-00000005 (step 5" "$d.$x.log" && [ ! -s "$d.$x.jsonl" ] && continue 2
    done
    fail "$d: both runs trained in one directory: $(grep -h '^resume' "$d.a.log" "$d.b.log")"
  fi
  if [ "$ra" -eq 0 ]; then won=a lost=b pid=$pa rc=$rb; else won=b lost=a pid=$pb rc=$ra; fi
  [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$((ra * rb))" -eq 0 ] ||
    fail "$d: expected one run to succeed and one to be refused, got exits $ra and $rb: $(tail -n 2 "$d.a.log" "$d.b.log")"
  grep -q "gpt2_train: error: checkpoint directory '$d' is in use by another run: process $pid on host [^ ]* holds its lock '$d/run.lock'" "$d.$lost.log" ||
    fail "$d: the refused run does not name process $pid: $(grep error "$d.$lost.log")"
  [ ! -e "$d.$lost.jsonl" ] || fail "$d: the refused run wrote metrics"
  same_losses full.jsonl "$d.$won.jsonl" > /dev/null
  races=$((races + 1))
done
echo "ok: $races of $tries trials started together; in each one run trained on and one was refused by name"
"$VERIFY" ck*/ > verify.log || fail "a checkpoint left does not verify: $(grep -v ' verify$' verify.log)"
echo "ok: every checkpoint left in the $tries directories verifies"

# Another process holds the lock (flock(1), writing its host and id as strata does): both ranks
# of a run are refused with the one line that names it, and nothing in the directory changes.
if command -v flock > /dev/null; then
  host=$(hostname)
  cp -r base held
  # The copy's lock file still names the killed run's process: start from none, so the wait below
  # reads the holder's own id.
  rm -f held/run.lock
  before=$(cd held && find . -type f ! -name run.lock | sort | xargs md5sum)
  flock held/run.lock sh -c 'printf "host %s\npid %s\n" "$1" $$ > held/run.lock; exec sleep 60' sh "$host" \
    > /dev/null 2>&1 &
  holder=$!
  for _ in $(seq 100); do grep -q '^pid ' held/run.lock 2> /dev/null && break; sleep 0.05; done
  pid=$(sed -n 's/^pid //p' held/run.lock)
  run 2 held.log "${args[@]}" --dp 2 --save held --resume && fail "a run wrote into a locked directory"
  kill "$pid" "$holder" 2> /dev/null
  wait "$holder" 2> /dev/null
  lines=$(grep "gpt2_train: error:" held.log | sort | uniq -c)
  [ "$(printf '%s\n' "$lines" | wc -l)" -eq 1 ] && printf '%s\n' "$lines" | grep -q "^ *2 .*is in use by another run: process $pid on host " ||
    fail "expected one identical refusal naming process $pid from each of the 2 ranks, got: $lines"
  [ "$(cd held && find . -type f ! -name run.lock | sort | xargs md5sum)" = "$before" ] ||
    fail "a refused run changed the directory"
  echo "ok: a directory locked by another process refuses both ranks alike, naming it"
fi
