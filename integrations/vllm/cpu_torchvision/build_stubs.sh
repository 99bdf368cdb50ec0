#!/usr/bin/env bash
# Build the CPU test environment's stand-ins for libtorch's CUDA libraries (cuda_stubs.c says why) into
# OUT, checking first that they define exactly the c10::cuda / at::cuda symbols torchvision's _C.so
# leaves undefined. Usage: build_stubs.sh PYTHON OUT. Then: export LD_LIBRARY_PATH=OUT
set -euo pipefail
PY="$1"; OUT="$2"; HERE="$(cd "$(dirname "$0")" && pwd)"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TV="$SITE/torchvision"
mkdir -p "$OUT"
want="$(nm -D --undefined-only "$TV/_C.so" | awk '{print $2}' | grep -E '^_ZN?K?(2at|3c10)4cuda' | sort -u)"
have="$(grep -oE '_ZN?K?(2at|3c10)4cuda[A-Za-z0-9_]*' "$HERE/cuda_stubs.c" | sort -u)"
if [ "$want" != "$have" ]; then
    echo "torchvision's _C.so needs other CUDA symbols than cuda_stubs.c defines:" >&2
    diff <(echo "$want") <(echo "$have") >&2 || true
    exit 1
fi
gcc -shared -fPIC -O1 -Wl,-soname,libc10_cuda.so -o "$OUT/libc10_cuda.so" "$HERE/cuda_stubs.c"
echo 'void mipruner_empty_libtorch_cuda(void) {}' | gcc -shared -fPIC -x c -Wl,-soname,libtorch_cuda.so -o "$OUT/libtorch_cuda.so" -
# libcudart.so.13: torchvision's wheel vendors it under another file name.
ln -sf "$(ls "$SITE"/torchvision.libs/libcudart.*.so.13 | head -1)" "$OUT/libcudart.so.13"
