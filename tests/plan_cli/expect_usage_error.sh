#!/usr/bin/env bash
# expect_usage_error.sh REGEX CMD [ARGS...]: passes when CMD exits with 2 (strata-plan's exit for
# bad or inconsistent flags) and its combined output matches the extended regex REGEX.
set -u
regex=$1; shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out" | tail -n 5
if [ "$rc" -ne 2 ]; then echo "FAIL: expected exit 2 (a usage error), got $rc"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then echo "FAIL: output does not match: $regex"; exit 1; fi
echo "ok: exit 2 with the expected message"
