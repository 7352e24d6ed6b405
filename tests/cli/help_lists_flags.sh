#!/usr/bin/env bash
# help_lists_flags.sh GPT2_TRAIN SOURCE: every flag SOURCE defines with add_option/add_flag
# ("--name" or "-n,--name") appears in GPT2_TRAIN --help, so a new flag cannot go undocumented.
set -u
bin=$1; src=$2
flags=$(grep -oE 'add_(option|flag)\("[^"]*"' "$src" | grep -oE -- '--[A-Za-z0-9][A-Za-z0-9-]*' | sort -u)
count=$(printf '%s\n' "$flags" | grep -c -- '^--')
# A grep that silently stopped matching would pass vacuously: gpt2_train has dozens of flags.
[ "$count" -ge 20 ] || { echo "FAIL: found only $count flags in $src"; exit 1; }
help=$("$bin" --help 2>&1) || { echo "FAIL: $bin --help exited non-zero"; printf '%s\n' "$help"; exit 1; }
missing=0
for f in $flags; do
  printf '%s\n' "$help" | grep -qE -- "(^|[ ,])$f([ ,=]|\$)" || { echo "FAIL: --help does not list $f"; missing=1; }
done
[ "$missing" -eq 0 ] || exit 1
echo "ok: --help lists all $count flags"
