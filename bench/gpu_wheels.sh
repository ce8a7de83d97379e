#!/usr/bin/env bash
# The wheels issue 19's GPU benches need that the lent GPU image lacks (bitsandbytes for
# `--optim adamw8bit`, torchao for `--float8`), for its Python 3.12 on x86-64, into .whl/
# (git-ignored; the device tool's `carry` takes it, 64 MiB with the tree: these are ~47 MB).
# Both import on torch 2.11 (checked on torch 2.11.0 here: AdamW8bit and convert_to_float8_training).
# Run once, here, in the repo root: bash bench/gpu_wheels.sh
set -euo pipefail
PY=${PYTHON:-python3}
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl bitsandbytes==0.50.2 torchao==0.18.0
du -sh .whl
