// AttentionLayer: query, key, value (and the mask) through the backend's AttentionKernel; the
// softmax probabilities [batch, heads, tokens, tokens] stashed for backward, or (recompute)
// computed again there by a second forward.
#include "core/layers/layers.h"

namespace tandem {
namespace {

// Probabilities no backward reads from the stash (evaluation, recompute) and a recomputing
// forward's output: read only inside one call, so every attention layer a thread runs shares
// them, grown to the largest asked for.
struct AttentionScratch {
  Tensor probs, out;
};
float* attention_scratch(Tensor AttentionScratch::*which, int64_t floats) {
  thread_local AttentionScratch scratch;
  Tensor& t = scratch.*which;
  if (!t.defined() || t.numel() < floats) t = Tensor::empty(Shape{floats});
  return t.data();
}

const float* mask_of(std::span<const Tensor> in) { return in.size() > 3 ? in[3].data() : nullptr; }

}  // namespace

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
  const int64_t probs = batch * geometry_.heads * tokens * tokens;
  float* p = training_ && !recompute_
                 ? static_cast<float*>(stash.reserve(static_cast<std::size_t>(probs) * sizeof(float)))
                 : attention_scratch(&AttentionScratch::probs, probs);
  kernel(in[0]).forward(in[0].data(), in[1].data(), in[2].data(), mask_of(in), out.data(), p);
}

void AttentionLayer::backward(std::span<const Tensor> in, const Tensor&, const Tensor& grad_out,
                              std::span<Tensor> grad_in, Stash& stash) {
  auto data = [&](std::size_t i) { return grad_in[i].defined() ? grad_in[i].data() : nullptr; };
  AttentionKernel& k = kernel(in[0]);
  const float* probs = reinterpret_cast<const float*>(stash.bytes.data());
  if (recompute_) {  // the same kernel on the same inputs: the forward's probabilities exactly
    const int64_t batch = in[0].shape()[0], tokens = in[0].shape()[1];
    float* p = attention_scratch(&AttentionScratch::probs, batch * geometry_.heads * tokens * tokens);
    k.forward(in[0].data(), in[1].data(), in[2].data(), mask_of(in),
              attention_scratch(&AttentionScratch::out, in[0].numel()), p);
    probs = p;
  }
  k.backward(in[0].data(), in[1].data(), in[2].data(), probs, grad_out.data(), data(0), data(1), data(2));
  if (grad_in.size() > 3 && grad_in[3].defined())  // the mask is not differentiable
    backend_.vectors().fill(grad_in[3].data(), 0.0f, grad_in[3].numel());
}

}  // namespace tandem
