#!/usr/bin/env bash
# progress_bar.sh GPT2_TRAIN WORKDIR: --progress bar redraws one line with carriage returns and
# ends it before the sample; the default off a terminal prints one plain line per step.
set -eu
bin=$1; dir=$2
mkdir -p "$dir"
args=(--steps 3 --batch 4 --seq 32 --d-model 32 --heads 2 --sample-tokens 8)
"$bin" "${args[@]}" --progress bar > "$dir/bar.txt"
"$bin" "${args[@]}" > "$dir/auto.txt"  # stdout is a file: plain lines

cr=$(tr -cd '\r' < "$dir/bar.txt" | wc -c)
[ "$cr" -eq 3 ] || { echo "FAIL: bar mode printed $cr carriage returns, expected one per step (3)"; exit 1; }
grep -q $'\r\\[####################\\]    3/3 | loss ' "$dir/bar.txt" || { echo "FAIL: no full bar at step 3/3"; exit 1; }
grep -q '^step ' "$dir/bar.txt" && { echo "FAIL: bar mode printed plain step lines"; exit 1; }
grep -q '^sample:' "$dir/bar.txt" || { echo "FAIL: the sample does not start a line of its own after the bar"; exit 1; }

[ "$(tr -cd '\r' < "$dir/auto.txt" | wc -c)" -eq 0 ] || { echo "FAIL: auto mode off a terminal drew a bar"; exit 1; }
[ "$(grep -c '^step    [123]/3 | loss ' "$dir/auto.txt")" -eq 3 ] || { echo "FAIL: auto mode lacks the 3 step lines"; exit 1; }
echo "ok: bar mode redraws in place; plain lines off a terminal"
