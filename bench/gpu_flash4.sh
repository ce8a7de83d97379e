#!/usr/bin/env bash
# FlashAttention 4 (flash-attn-4, CuTe DSL) for the attention part's `--attention flex-flash` row:
# FlexAttention's BACKEND "FLASH". The device image lacks it, and it does not fit one device call's
# 64 MiB beside the tree: its CUDA 13 compiler libraries (nvidia-cutlass-dsl-libs-cu13) are a 92 MB
# wheel, 64 MB as xz. So it travels in two calls that follow each other while the machine is warm:
#
#   here, once:   bash bench/gpu_flash4.sh fetch    # .fa4a/ (the small wheels + the first 46 MB of
#                                                   # the libraries' xz), .fa4b/ (the rest)
#   call 1:       carry [".whl", ".fa4a"]; the command starts `cp -r .fa4a /tmp/fa4a;` (kept there
#                 while the machine stays warm: 30 s after a call)
#   call 2:       carry [".fa4b"]; `bash bench/gpu_flash4.sh install && export PYTHONPATH=...` (below)
#
# install prints the PYTHONPATH entries to use (pip --target does not run the package's .pth, which
# puts the DSL's own packages on the path). Versions: flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1,
# checked against torch 2.11's flex templates (flash_attn.cute.interface._flash_attn_fwd/_bwd,
# flash_attn.cute.block_sparsity.BlockSparseTensorsTorch).
set -euo pipefail
PY=${PYTHON:-python3}
SITE=/tmp/site-fa4
case ${1:-} in
  fetch)
    dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$@"; }
    rm -rf .fa4a .fa4b && mkdir -p .fa4a .fa4b /tmp/fa4-fetch
    dl .fa4a flash-attn-4==4.0.0b36 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 \
      nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
    dl /tmp/fa4-fetch nvidia-cutlass-dsl-libs-cu13==4.8.1
    rm -rf /tmp/fa4-fetch/x && mkdir /tmp/fa4-fetch/x
    (cd /tmp/fa4-fetch/x && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl && tar cf - . | xz -T0 -9) \
      > /tmp/fa4-fetch/libs.tar.xz
    split -b 46M -d /tmp/fa4-fetch/libs.tar.xz /tmp/fa4-fetch/libs.tar.xz.
    mv /tmp/fa4-fetch/libs.tar.xz.00 .fa4a/ && mv /tmp/fa4-fetch/libs.tar.xz.01 .fa4b/
    du -sh .fa4a .fa4b
    ;;
  install)
    a=/tmp/fa4a
    [ -d "$a" ] || a=.fa4a
    if [ ! -f "$a/libs.tar.xz.00" ] || [ ! -f .fa4b/libs.tar.xz.01 ]; then
      echo "FlashAttention 4 not installed: the libraries' first part ($a/libs.tar.xz.00, from the previous" \
        "call) or second (.fa4b/libs.tar.xz.01) is missing" >&2
      exit 1
    fi
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --only-binary=:all: \
      --python-version 3.12 --implementation cp --target "$SITE" "$a"/*.whl  # the device image's Python
    cat "$a/libs.tar.xz.00" .fa4b/libs.tar.xz.01 | xz -d | tar xf - -C "$SITE"
    echo "$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"
    ;;
  *)
    echo "usage: bash bench/gpu_flash4.sh fetch|install" >&2
    exit 2
    ;;
esac
