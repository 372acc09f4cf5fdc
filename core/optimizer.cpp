#include "core/optimizer.h"

#include "core/error.h"

namespace tandem {

Sgd::Sgd(std::vector<Param*> params, const SgdOptions& options) : params_(std::move(params)), options_(options) {
  if (options_.lr < 0.0f) fail("sgd", cat("learning rate must be >= 0, got ", options_.lr));
  if (options_.momentum < 0.0f) fail("sgd", cat("momentum must be >= 0, got ", options_.momentum));
  if (options_.nesterov && (options_.momentum <= 0.0f || options_.dampening != 0.0f))
    fail("sgd", "nesterov needs momentum > 0 and zero dampening");
  if (options_.momentum > 0.0f)
    for (Param* p : params_) momentum_.push_back(Tensor::zeros(p->value().shape()));
}

void Sgd::step() {
  const float lr = options_.lr, mu = options_.momentum, wd = options_.weight_decay;
  const float damp = options_.dampening;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Param& p = *params_[k];
    float* w = p.value().data();
    const float* g = p.grad().data();
    const int64_t n = p.value().numel();
    if (mu == 0.0f) {
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else {
      float* buf = momentum_[k].data();
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        buf[i] = started_ ? mu * buf[i] + (1.0f - damp) * d : d;
        w[i] -= lr * (options_.nesterov ? d + mu * buf[i] : buf[i]);
      }
    }
    p.bump_version();
  }
  started_ = true;
}

}  // namespace tandem
