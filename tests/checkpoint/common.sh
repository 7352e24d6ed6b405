# Shared by the checkpoint tests: sourced with TRAIN (gpt2_train), WORK (a scratch directory)
# and MPIRUN (the launcher up to the rank count, e.g. "mpiexec -n") set.
set -u
mkdir -p "$WORK"
cd "$WORK"

# run NP LOG ARGS...: gpt2_train on NP ranks; returns its exit code.
run() {
  local np=$1 log=$2; shift 2
  # shellcheck disable=SC2086
  $MPIRUN "$np" $MPI_AFTER_NP "$TRAIN" "$@" > "$log" 2>&1
}
# losses FILE: "step loss" per metrics line, the loss exactly as written (17 digits).
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
fail() {
  echo "FAIL: $*"
  exit 1
}
# same_losses A B: every step in B has exactly A's loss for that step (bit for bit).
same_losses() {
  local a=$1 b=$2
  [ -s "$b" ] || fail "$b has no steps"
  join <(losses "$a" | sort -k1,1) <(losses "$b" | sort -k1,1) > joined.txt
  [ "$(wc -l < joined.txt)" -eq "$(losses "$b" | wc -l)" ] || fail "steps of $b missing from $a"
  awk '$2 != $3 { print "step " $1 ": " $2 " uninterrupted, " $3 " resumed"; bad = 1 } END { exit bad }' joined.txt ||
    fail "resumed losses differ from the uninterrupted run"
  echo "ok: steps $(losses "$b" | awk '{printf "%s ", $1}')match the uninterrupted run bit for bit"
}
