#!/usr/bin/env bash
# expect_failure_on_ranks.sh N REGEX CMD [ARGS...]: as expect_failure.sh, and the message is said
# N times: once by each of the N ranks CMD launches, none left waiting for another.
set -u
ranks=$1 regex=$2; shift 2
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out" | tail -n 8
if [ "$rc" -eq 0 ]; then echo "FAIL: expected a non-zero exit, got 0"; exit 1; fi
if [ "$rc" -ge 128 ]; then echo "FAIL: ended by signal $((rc - 128))"; exit 1; fi
said=$(printf '%s\n' "$out" | grep -Ec -- "$regex")
if [ "$said" -ne "$ranks" ]; then echo "FAIL: the message was said $said times, expected once by each of $ranks ranks"; exit 1; fi
echo "ok: exit $rc, the message once on each of $ranks ranks"
