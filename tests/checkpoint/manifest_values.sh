#!/usr/bin/env bash
# manifest_values.sh GPT2_TRAIN WORKDIR EXPECT_FAILURE: a manifest edited and re-checksummed (as a
# buggy or foreign writer would leave it) is refused naming the manifest and the field - never
# narrowed (a step of 2^32 + 2 read as 2), never believed (a step that is not its directory's),
# and never allowed to divide the gradients by a loss scale of 0 (fp32 used to apply NaN and exit 0).
set -eu
train=$1 work=$2 expect=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
small=(--batch 4 --seq 16 --d-model 32 --heads 2 --layers 2 --sample-tokens 0 --progress lines)
"$train" "${small[@]}" --steps 2 --save ck > first.log
m=ck/step-00000002/manifest.json
grep -q '"scale": 1.0,' "$m" && grep -q '"step": 2,' "$m" || { echo "FAIL: unexpected manifest: $(cat "$m")"; exit 1; }

# edited SED: a copy of ck with the manifest edited and COMPLETE rewritten to match it (gzip's
# trailer holds the CRC-32 that COMPLETE records).
edited() {
  rm -rf x; cp -r ck x
  sed -i "$1" x/step-00000002/manifest.json
  printf 'crc32 %s\n' "$(gzip -c x/step-00000002/manifest.json | tail -c8 | head -c4 | od -An -tx4 | tr -d ' \n')" \
    > x/step-00000002/COMPLETE
}
check() {  # check SED FIELD-MESSAGE
  edited "$1"
  "$expect" "skipping checkpoint manifest 'x/step-00000002/manifest.json': $2" \
    "$train" "${small[@]}" --steps 3 --save x --resume --export x.safetensors
}
check 's/"scale": 1.0,/"scale": 0,/' "loss_scaler.scale is 0; expected a positive finite number"
check 's/"scale": 1.0,/"scale": -2.0,/' "loss_scaler.scale is -2.0"
check 's/"scale": 1.0,/"scale": null,/' "loss_scaler.scale is null"
check 's/"step": 2,/"step": 4294967298,/' "step is 4294967298; expected a whole number from 0 to 2147483647"
check 's/"step": 2,/"step": 7,/' "step is 7, but its directory is that of step 2"
check 's/"steps": 2/"steps": 3/' "optimizer.steps is 3; expected a whole number from 0 to 2"
check 's/"position": 2/"position": -1/' "data.position is -1"
check 's/"name": "rank-00000.safetensors"/"name": "..\/rank-00000.safetensors"/' 'files\[0\].name is "../rank-00000.safetensors"'
[ ! -e x.safetensors ] || { echo "FAIL: a refused checkpoint was trained on and exported"; exit 1; }

# The untouched checkpoint, re-checksummed the same way, still resumes.
edited 's/x/x/'
"$train" "${small[@]}" --steps 3 --save x --resume > ok.log
grep -q "resume: x/step-00000002 (step 2" ok.log || { echo "FAIL: the intact checkpoint did not resume"; exit 1; }
echo "ok: every edited manifest value is refused by name"
