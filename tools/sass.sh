#!/usr/bin/env bash
# SASS of a CUDA source compiled here for sm_90a, without a GPU and without CUDA 13's cuobjdump
# (this machine's toolkit has none): nvdisasm from Debian's CUDA 11.8 package (non-free; fetched
# once into $SASS_CACHE, nothing installed), reading the cubin nvcc 13 writes after its ELF header
# is rewritten to the older layout nvdisasm 11.8 expects (same sm_90 instruction encoding).
#   tools/sass.sh src/backend/cuda/moe_fused.cu [extra nvcc args] > moe_fused.sass
# Then e.g. count a kernel's instructions, or find a loop's length between its label and the
# backward branch. For reading, not for building anything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SASS_CACHE:-$HOME/.cache/switchyard-sass}
nvdisasm=$cache/usr/bin/nvdisasm
if [[ ! -x $nvdisasm ]]; then
  mkdir -p "$cache"
  sources=/etc/apt/sources.list.d/switchyard-nonfree.sources
  if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q Candidate:.*[0-9]; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$sources"
    apt-get update -qq
  fi
  (cd "$cache" && apt-get download nvidia-cuda-toolkit >&2 && dpkg -x nvidia-cuda-toolkit_*.deb . && rm -f nvidia-cuda-toolkit_*.deb)
  rm -f "$sources"  # (only for the download; the next apt-get update forgets the index)
fi
src=$1; shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -std=c++17 -arch=sm_90a -I"$root/src" -cubin "$src" -o "$tmp/k.cubin" "$@"
python3 - "$tmp/k.cubin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
b[7] = 0x33                                # EI_OSABI: CUDA
b[8] = 7                                   # EI_ABIVERSION: the layout before CUDA 12
struct.pack_into('<I', b, 48, 0x005A055A)  # e_flags: sm_90, virtual sm_90, 64-bit addresses
open(sys.argv[1], 'wb').write(b)
PY
"$nvdisasm" -c "$tmp/k.cubin"
