// SGD with momentum, dampening, Nesterov and weight decay, with PyTorch's update rule
// (torch.optim.SGD), so a run can be compared step for step with a PyTorch peer.
#pragma once

#include <vector>

#include "core/param.h"

namespace tandem {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

class Sgd {
 public:
  Sgd(std::vector<Param*> params, const SgdOptions& options);
  // Applies one update from the accumulated gradients and bumps each parameter's version.
  void step();
  void set_lr(float lr) { options_.lr = lr; }
  const SgdOptions& options() const { return options_; }
  // Momentum buffers, in parameter order (for checkpoints).
  std::vector<Tensor>& momentum_buffers() { return momentum_; }

 private:
  std::vector<Param*> params_;
  SgdOptions options_;
  std::vector<Tensor> momentum_;
  bool started_ = false;
};

}  // namespace tandem
