// AttentionLayer: query, key, value (and the mask) through the backend's AttentionKernel; the
// softmax probabilities [batch, heads, tokens, tokens] stashed for backward.
#include "core/layers/layers.h"

namespace tandem {

AttentionLayer::AttentionLayer(const GraphNode& node, const Shape& in, Backend& backend)
    : Layer(node.spec.name), backend_(backend) {
  geometry_.tokens = in[0];
  geometry_.heads = node.spec.attention.heads;
  geometry_.head_dim = in[1] / geometry_.heads;
  geometry_.causal = node.spec.attention.causal;
}

// Per batch size and sequence length (the input's shape[1]: shorter with length buckets).
AttentionKernel& AttentionLayer::kernel(const Tensor& q) {
  return kernels_.get(q.shape()[0], q.shape()[1], [&](int64_t n, int64_t tokens) {
    AttentionGeometry g = geometry_;
    g.batch = n;
    g.tokens = tokens;
    return backend_.attention(g);
  });
}

void AttentionLayer::forward(std::span<const Tensor> in, Tensor& out, Stash& stash) {
  const int64_t batch = in[0].shape()[0], tokens = in[0].shape()[1];
  const std::size_t probs = static_cast<std::size_t>(batch * geometry_.heads * tokens * tokens);
  auto* p = static_cast<float*>(stash.reserve(probs * sizeof(float)));
  kernel(in[0]).forward(in[0].data(), in[1].data(), in[2].data(), in.size() > 3 ? in[3].data() : nullptr, out.data(), p);
}

void AttentionLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  auto data = [&](std::size_t i) { return grad_in[i].defined() ? grad_in[i].data() : nullptr; };
  kernel(in[0]).backward(in[0].data(), in[1].data(), in[2].data(),
                                    reinterpret_cast<const float*>(stash.bytes.data()), grad_out.data(), data(0),
                                    data(1), data(2));
  if (grad_in.size() > 3 && grad_in[3].defined()) grad_in[3].fill(0.0f);  // the mask is not differentiable
}

}  // namespace tandem
