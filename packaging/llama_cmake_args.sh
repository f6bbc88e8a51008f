#!/usr/bin/env sh
# Print the CMAKE_ARGS for building llama-cpp-python (llama.cpp) for a backend.
#   usage: llama_cmake_args.sh BACKEND PORTABLE      (BACKEND: cpu | cuda | metal; PORTABLE: 0 | 1)
#
# x86-64 CPU builds never use -march=native: on CPUs that report AMX (Sapphire Rapids and later), a native
# build enables llama.cpp's AMX matmul, which crashed with SIGSEGV (ggml_backend_amx_mul_mat) on the
# bundled Q4_K_M model in our VMs. Instead we turn on the AVX/AVX2/AVX-512 features this CPU reports,
# one by one, and leave AMX off. PORTABLE=1 targets any x86-64 CPU with AVX2 (Haswell, 2013, and newer).
backend="${1:-cpu}"; portable="${2:-0}"
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
case "$backend" in
  cuda)  args="$args -DGGML_CUDA=on" ;;
  metal) args="-DGGML_METAL=on" ;;  # Apple silicon: the default native build is right there
  cpu)   ;;
  *) echo "unknown backend: $backend" >&2; exit 2 ;;
esac
arch="$(uname -m)"
if [ "$backend" != metal ] && { [ "$arch" = x86_64 ] || [ "$arch" = amd64 ]; }; then
  if [ "$portable" = 1 ] || [ ! -r /proc/cpuinfo ]; then
    args="$args -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  else
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { case "$flags" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    has avx && args="$args -DGGML_AVX=ON"
    has avx2 && args="$args -DGGML_AVX2=ON"
    has fma && args="$args -DGGML_FMA=ON"
    has f16c && args="$args -DGGML_F16C=ON"
    has bmi2 && args="$args -DGGML_BMI2=ON"
    has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
    if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
      args="$args -DGGML_AVX512=ON"
      has avx512vbmi && args="$args -DGGML_AVX512_VBMI=ON"
      has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
      has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    fi
  fi
elif [ "$backend" = cpu ] && [ "$portable" != 1 ]; then
  args="-DGGML_NATIVE=ON"   # arm64 and others: no AMX there; native is fine
fi
echo "$args"
