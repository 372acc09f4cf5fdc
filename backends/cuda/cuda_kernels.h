// The cuda backend's own device kernels, for what cuBLAS and cuDNN do not do: activations,
// softmax, pooling, layer norm, attention's masked softmax, bias rows and column sums.
// Launchers on a stream; every pointer is device memory; shapes as core/backend.h's contract.
#pragma once

#include <cstdint>
#include <string_view>

#include <cuda_runtime_api.h>

#include "core/geometry.h"

namespace tandem::cuda {

enum class ActivationKind : int { Relu6, Hardswish, Gelu, GeluTanh, Sigmoid, Tanh, Silu, Hardsigmoid };

// The kernel for an activation op's name (core/ops); false when there is none.
bool activation_kind(std::string_view name, ActivationKind& kind);

// Each returns the launch's error (cudaSuccess when it was queued).
cudaError_t activation_forward(ActivationKind kind, const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t activation_backward(ActivationKind kind, const float* x, const float* y, const float* dy, float* dx,
                                int64_t n, cudaStream_t s);
cudaError_t relu_forward(const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t s);
cudaError_t add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);

// x[i] = value.
cudaError_t fill(float* x, float value, int64_t n, cudaStream_t s);
// y[r, c] = bias[c] (a GEMM or convolution then adds onto it). Column sums (bias gradients)
// are cuBLAS' GEMV with ones: Context::column_sums.
cudaError_t bias_rows(const float* bias, float* y, int64_t rows, int64_t cols, cudaStream_t s);

// Softmax over each row of [rows, cols]; backward dx = y * (dy - sum(dy * y)).
cudaError_t softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, cudaStream_t s);

// Mean over the plane (h * w) of each channel, NHWC.
cudaError_t global_avg_pool_forward(const float* x, float* y, int64_t batch, int64_t plane, int64_t channels,
                                    cudaStream_t s);
cudaError_t global_avg_pool_backward(const float* dy, float* dx, int64_t batch, int64_t plane, int64_t channels,
                                     cudaStream_t s);

// Max pooling with each output's argmax (iy * in_w + ix, -1 for an all-padding window) in
// `arg`; backward gathers, so no atomics and the same sums every run.
cudaError_t max_pool_forward(const Pool2dGeometry& g, const float* x, float* y, int32_t* arg, cudaStream_t s);
cudaError_t max_pool_backward(const Pool2dGeometry& g, const float* dy, const int32_t* arg, float* dx, cudaStream_t s);
// Average pooling, torch's default (count_include_pad: every window divides by kh * kw).
cudaError_t avg_pool_forward(const Pool2dGeometry& g, const float* x, float* y, cudaStream_t s);
cudaError_t avg_pool_backward(const Pool2dGeometry& g, const float* dy, float* dx, cudaStream_t s);

// Layer normalisation of `rows` rows of `features`: forward writes y and each row's mean and
// (biased) variance; backward_data dx; layer_norm_dy_xhat dy * xhat, whose column sums are
// dgamma (dbeta: dy's).
cudaError_t layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                               float* var, int64_t rows, int64_t features, float eps, cudaStream_t s);
cudaError_t layer_norm_backward_data(const float* x, const float* dy, const float* gamma, const float* mean,
                                     const float* var, float* dx, int64_t rows, int64_t features, float eps,
                                     cudaStream_t s);
cudaError_t layer_norm_dy_xhat(const float* x, const float* dy, const float* mean, const float* var, float* out,
                               int64_t rows, int64_t features, float eps, cudaStream_t s);

// Dropout (DropoutKernel): keep[i] from core/dropout_bits.h's stream (base, threshold), y = keep ?
// x * scale : 0; backward dx = keep ? dy * scale : 0.
cudaError_t dropout_forward(uint64_t base, uint64_t threshold, float scale, const float* x, float* y, uint8_t* keep,
                            int64_t n, cudaStream_t s);
cudaError_t dropout_backward(const uint8_t* keep, float scale, const float* dy, float* dx, int64_t n, cudaStream_t s);

// Token pooling (TokenPoolKernel): y[b, f] = sum over t of w[b, t] x[b, t, f] in token order,
// tokens of weight 0 skipped; backward dx[b, t, f] = w[b, t] dy[b, f].
cudaError_t token_pool_forward(const float* x, const float* w, float* y, int64_t batch, int64_t tokens,
                               int64_t features, cudaStream_t s);
cudaError_t token_pool_backward(const float* dy, const float* w, float* dx, int64_t batch, int64_t tokens,
                                int64_t features, cudaStream_t s);
// The mul op: y = a * b, a [batch, outer, inner] and b [batch, inner] repeated over outer;
// backward da = dy * b and db = the sum over outer of dy * a (a null one skipped).
cudaError_t mul_forward(const float* a, const float* b, float* y, int64_t batch, int64_t outer, int64_t inner,
                        cudaStream_t s);
cudaError_t mul_backward(const float* dy, const float* a, const float* b, float* da, float* db, int64_t batch,
                         int64_t outer, int64_t inner, cudaStream_t s);

// Attention's scores [batch, heads, tokens, tokens] (raw q.k) become probabilities in place:
// scaled, keys the mask drops (mask [batch, tokens], 0: drop; may be null) and, causal, keys
// after the query left out; a query that keeps no key gets all zeros, never NaN.
cudaError_t attention_softmax(float* scores, const float* mask, int64_t batch, int64_t heads, int64_t tokens,
                              float scale, bool causal, cudaStream_t s);
// dP [rows, tokens] becomes dS = P * (dP - sum(dP * P)) * scale in place.
cudaError_t attention_softmax_backward(const float* probs, float* dprobs, int64_t rows, int64_t tokens, float scale,
                                       cudaStream_t s);

}  // namespace tandem::cuda
