#!/usr/bin/env bash
# Peers for the decode-threads comparison (issue 12 item 7): build llama.cpp from source, convert
# the demo model to GGUF with llama.cpp's own converter, quantise it to Q4_0, and benchmark it
# beside Nectar's int4 demo. benchmarks/peers.md has the why and the measured figures.
#
#   benchmarks/peers.sh source DIR            # llama.cpp source out of llama-cpp-python's sdist (PyPI)
#   benchmarks/peers.sh build SRC DEST [JOBS] # CPU build, runtime-dispatched ISA variants -> DEST/bin
#   benchmarks/peers.sh convert SRC BIN DEST  # demo model -> DEST/demo-bf16.gguf, DEST/demo-q4_0.gguf
#   benchmarks/peers.sh check BIN GGUF        # greedy output vs the Hugging Face reference
#   benchmarks/peers.sh bench BIN GGUF [bench_threads.py arguments...]
#
# Nothing here is committed output: DIR/DEST live outside the repository (e.g. /work/peers) or
# under the ignored .peers/ (what the device tool carries).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The llama.cpp snapshot: llama-cpp-python 0.3.36 vendors llama.cpp at upstream commit 0c1e570
# (2026-10-01), which converts and runs `GlmMoeDsaForCausalLM` with its DSA indexer
# (`indexer_types` full/shared). PyPI is reachable where GitHub is not.
llama_cpp_python=0.3.36
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

cmd=${1:-}
shift || true
case $cmd in
source)
  dir=${1:?usage: peers.sh source DIR}
  mkdir -p "$dir"
  python3 -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$llama_cpp_python" -d "$dir"
  echo "$sdist_sha256  $dir/llama_cpp_python-$llama_cpp_python.tar.gz" | sha256sum -c -
  tar xzf "$dir/llama_cpp_python-$llama_cpp_python.tar.gz" -C "$dir"
  rm -rf "$dir/llama.cpp"
  mv "$dir/llama_cpp_python-$llama_cpp_python/vendor/llama.cpp" "$dir/llama.cpp"
  rm -f "$dir/llama.cpp/.git" # a submodule pointer into a tree that is not there
  echo "$dir/llama.cpp"
  ;;
build)
  src=${1:?usage: peers.sh build SRC DEST [JOBS]}
  dest=${2:?usage: peers.sh build SRC DEST [JOBS]}
  jobs=${3:-$(nproc)}
  # VARIANTS: the CPU variants to build (default: a generic fallback, AVX2, and the two CPUs the
  # project measures on: zen4 = AVX-512 VNNI/BF16 for the EPYC VM, sapphirerapids = the same
  # plus AMX for the Xeon). `all` keeps upstream's 14 x86 variants (26 files each: long on 2 cores).
  variants=${VARIANTS:-x64 haswell zen4 sapphirerapids}
  if [ "$variants" != all ]; then
    python3 - "$src/ggml/src/CMakeLists.txt" $variants <<'PY'
import re, sys
path, keep = sys.argv[1], set(sys.argv[2:])
lines = open(path).read().split("\n")
x86 = False  # inside the `if (GGML_SYSTEM_ARCH STREQUAL "x86")` branch of the variant list
for i, line in enumerate(lines):
    if "GGML_SYSTEM_ARCH STREQUAL" in line:
        x86 = '"x86"' in line
    m = re.match(r"(\s*)ggml_add_cpu_backend_variant\((\w+)\s", line + " ")
    if x86 and m and m.group(2) not in keep:
        lines[i] = m.group(1) + "# (peers.sh: not built) " + line.strip()
open(path, "w").write("\n".join(lines))
PY
  fi
  # One fix, or llama.cpp cannot run the demo at all: for DeepSeek-style indexers (glm-dsa
  # among them) it always rotates the indexer's q and k by a Hadamard matrix, whose size is the
  # largest power of two dividing the indexer head but never below 64 — the demo's
  # index_head_dim is 32 (GLM-5's 128), so the graph aborts with
  # `GGML_ASSERT(ggml_can_mul_mat(a, b)) failed` (ggml.c:3354, from llama_model_glm_dsa's graph).
  # Letting the size go down to 16 changes nothing for heads of 64 and more; for 32 it is the
  # same rotation one size smaller (orthogonal on q and k alike, so the indexer's scores are
  # unchanged). peers.md: greedy output checked against the Hugging Face reference.
  kv=$src/src/llama-kv-cache.cpp
  if ! grep -q 'peers.sh: indexer heads below 64' "$kv"; then
    grep -q 'int64_t n = 64; n <= std::max(n_embd_head_k_all' "$kv"
    [ "$(grep -c 'int nrot = 64;' "$kv")" = 2 ]
    sed -i -e 's|int64_t n = 64; n <= std::max(n_embd_head_k_all|int64_t n = 16; n <= std::max(n_embd_head_k_all|' \
      -e '0,/int nrot = 64;/s||int nrot = 16; // peers.sh: indexer heads below 64|' "$kv"
  fi
  # Portable x86-64: no -march=native. Every CPU variant (x64 … zen4, sapphirerapids) is built
  # as its own module and ggml loads the best one the running CPU supports, so the same
  # binaries run on the 2-vCPU EPYC VM and the 16-core Xeon. libstdc++/libgcc are linked
  # statically and libgomp is copied beside the binaries (rpath $ORIGIN): the directory is
  # self-contained.
  cmake -S "$src" -B "$src/build-peers" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
    '-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc' \
    '-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ -static-libgcc' \
    '-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++ -static-libgcc'
  cmake --build "$src/build-peers" -j "$jobs" --target llama-bench llama-quantize llama-completion
  mkdir -p "$dest/bin"
  # Libraries under the names the binaries ask for (their sonames, *.so.0), the per-binary
  # *-impl.so and the CPU variant modules ggml loads by name.
  b=$src/build-peers/bin
  cp -L "$b"/llama-{bench,quantize,completion} "$b"/lib*.so.0 "$b"/lib*-impl.so \
    "$b"/libggml-cpu-*.so "$dest/bin/"
  cp "$(g++ -print-file-name=libgomp.so.1)" "$dest/bin/"
  strip "$dest"/bin/*
  du -sh "$dest/bin"
  ;;
convert)
  src=${1:?usage: peers.sh convert SRC BIN DEST}
  bin=${2:?usage: peers.sh convert SRC BIN DEST}
  dest=${3:?usage: peers.sh convert SRC BIN DEST}
  mkdir -p "$dest"
  python3 "$root/benchmarks/peers_convert.py" "$src" "$root/models/nectar-demo-glm5" \
    "$dest/demo-bf16.gguf"
  "$bin/llama-quantize" "$dest/demo-bf16.gguf" "$dest/demo-q4_0.gguf" Q4_0
  ls -la "$dest"
  ;;
check)
  exec python3 "$root/benchmarks/peers_check.py" "${1:?usage: peers.sh check BIN GGUF}" \
    "${2:?usage: peers.sh check BIN GGUF}" code_long zh
  ;;
bench)
  bin=${1:?usage: peers.sh bench BIN GGUF [bench_threads.py arguments...]}
  gguf=${2:?usage: peers.sh bench BIN GGUF [bench_threads.py arguments...]}
  shift 2
  exec python3 "$root/scripts/bench_threads.py" --llama-bench "$bin/llama-bench" --gguf "$gguf" "$@"
  ;;
*)
  sed -n '2,13p' "$0"
  exit 2
  ;;
esac
