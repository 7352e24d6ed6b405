#!/usr/bin/env bash
# expect_failure.sh REGEX CMD [ARGS...]: passes when CMD exits non-zero by itself (not by a
# signal) and its combined output matches the extended regex REGEX.
set -u
regex=$1; shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out" | tail -n 5
if [ "$rc" -eq 0 ]; then echo "FAIL: expected a non-zero exit, got 0"; exit 1; fi
if [ "$rc" -ge 128 ]; then echo "FAIL: ended by signal $((rc - 128))"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then echo "FAIL: output does not match: $regex"; exit 1; fi
echo "ok: exit $rc with the expected message"
