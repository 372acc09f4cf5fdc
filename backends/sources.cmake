# The backends that build wherever core builds (relative to backends/), shared by the native
# build and the wasm build (wasm/): the reference oracle, the portable one, their SIMD kernels
# and the registry.
set(TANDEM_PORTABLE_BACKEND_SOURCES
  reference/reference_backend.cpp
  reference/reference_batch_norm.cpp
  reference/reference_token_pool.cpp
  reference/reference_mul.cpp
  reference/reference_dropout.cpp
  portable/portable_backend.cpp
  simd/direct_conv2d.cpp
  simd/winograd_conv2d.cpp
  simd/max_pool_2x2.cpp
  simd/column_sums.cpp
  simd/gemm.cpp
  simd/layer_norm.cpp
  simd/attention.cpp
  simd/activation.cpp
)
