#include "core/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

int optimizer_state_floats(const OptimizerOptions& options) {
  if (options.kind == "adam" || options.kind == "adamw") return 2;
  return options.momentum != 0.0f ? 1 : 0;
}

Optimizer::Optimizer(std::vector<Param*> params, const OptimizerOptions& options)
    : params_(std::move(params)), options_(options) {
  const char* who = options_.kind.c_str();
  if (!(options_.lr >= 0.0f)) fail(who, cat("learning rate must be >= 0, got ", options_.lr));
  if (!(options_.weight_decay >= 0.0f)) fail(who, cat("weight decay must be >= 0, got ", options_.weight_decay));
  if (!(options_.clip_norm >= 0.0f)) fail(who, cat("clip norm must be >= 0 (0: off), got ", options_.clip_norm));
}

void Optimizer::step() {
  // One squared_norms call for the parameters that share a VectorKernel (all of them, in a
  // network), each sum in double, added in parameter order.
  const std::size_t count = params_.size();
  norm_x_.resize(count);
  norm_n_.resize(count);
  norm_out_.resize(count);
  double sum = 0.0;
  for (std::size_t first = 0; first < count;) {
    VectorKernel& v = params_[first]->vectors();
    std::size_t end = first;
    for (; end < count && &params_[end]->vectors() == &v; ++end) {
      norm_x_[end] = params_[end]->grad().data();
      norm_n_[end] = params_[end]->grad().numel();
    }
    v.squared_norms(norm_x_.data() + first, norm_n_.data() + first, static_cast<int>(end - first),
                    norm_out_.data() + first);
    first = end;
  }
  for (double s : norm_out_) sum += s;
  last_norm_ = std::sqrt(sum);
  if (options_.clip_norm > 0.0f) {
    // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1.
    const double coef = options_.clip_norm / (last_norm_ + 1e-6);
    if (coef < 1.0)
      for (Param* p : params_) p->vectors().scale(p->grad().data(), coef, p->grad().numel());
  }
  update(lr());
  ++steps_;
  VectorKernel* waited = nullptr;  // the new weights are whole for the host (a save, a round)
  for (Param* p : params_) {
    p->bump_version();
    if (&p->vectors() != waited) (waited = &p->vectors())->wait();
  }
}

Sgd::Sgd(std::vector<Param*> params, const OptimizerOptions& options) : Optimizer(std::move(params), options) {
  if (!(options_.momentum >= 0.0f)) fail("sgd", cat("momentum must be >= 0, got ", options_.momentum));
  if (options_.nesterov && (options_.momentum <= 0.0f || options_.dampening != 0.0f))
    fail("sgd", "nesterov needs momentum > 0 and zero dampening");
  if (options_.momentum > 0.0f)
    for (Param* p : params_) momentum_.push_back(Tensor::zeros(p->value().shape()));
}

std::vector<Tensor*> Sgd::state() {
  std::vector<Tensor*> out;
  for (Tensor& t : momentum_) out.push_back(&t);
  return out;
}

void Sgd::update(float lr) {
  const SgdUpdate u{lr, options_.momentum, options_.dampening, options_.weight_decay, options_.nesterov, steps_ == 0};
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Param& p = *params_[k];
    p.vectors().sgd(u, p.value().data(), p.grad().data(), momentum_.empty() ? nullptr : momentum_[k].data(),
                    p.value().numel());
  }
}

Adam::Adam(std::vector<Param*> params, const OptimizerOptions& options) : Optimizer(std::move(params), options) {
  const OptimizerOptions& o = options_;
  if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f))
    fail(o.kind.c_str(), cat("betas must be in [0, 1), got ", o.beta1, " and ", o.beta2));
  if (!(o.eps >= 0.0f)) fail(o.kind.c_str(), cat("eps must be >= 0, got ", o.eps));
  for (Param* p : params_) {
    m_.push_back(Tensor::zeros(p->value().shape()));
    v_.push_back(Tensor::zeros(p->value().shape()));
  }
}

std::vector<Tensor*> Adam::state() {
  std::vector<Tensor*> out;
  for (std::size_t k = 0; k < m_.size(); ++k) {
    out.push_back(&m_[k]);
    out.push_back(&v_[k]);
  }
  return out;
}

void Adam::update(float lr) {
  const OptimizerOptions& o = options_;
  const int64_t t = steps_ + 1;
  // torch.optim.Adam: step = lr / (1 - b1^t), denom = sqrt(v) / sqrt(1 - b2^t) + eps.
  const double c1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t));
  const double c2 = 1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t));
  const AdamUpdate u{static_cast<float>(lr / c1), static_cast<float>(std::sqrt(c2)), o.beta1, o.beta2, o.eps,
                     o.weight_decay, 1.0f - lr * o.weight_decay, o.kind == "adamw"};
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Param& p = *params_[k];
    p.vectors().adam(u, p.value().data(), p.grad().data(), m_[k].data(), v_[k].data(), p.value().numel());
  }
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<Param*> params, const OptimizerOptions& options) {
  if (options.kind == "sgd") return std::make_unique<Sgd>(std::move(params), options);
  if (options.kind == "adam" || options.kind == "adamw") return std::make_unique<Adam>(std::move(params), options);
  fail("optimizer", cat("unknown optimizer '", options.kind, "' (known: sgd, adam, adamw)"));
}

}  // namespace tandem
