// Optimizers with PyTorch's update rules, so a run can be compared step for step with a
// PyTorch peer: SGD (torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay), Adam
// and AdamW (decoupled weight decay); optional clipping of the gradients' global norm
// (torch.nn.utils.clip_grad_norm_) over the optimizer's parameters; and a learning-rate
// scale set per step by a schedule (schedule.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/param.h"

namespace tandem {

struct OptimizerOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  std::string kind = "sgd";  // sgd | adam | adamw
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float clip_norm = 0.0f;  // > 0: scale the gradients so their global L2 norm is at most this
};

// Floats of state a trainable parameter's value carries under these options: SGD's momentum
// buffer (when momentum is on), Adam's and AdamW's two moments.
int optimizer_state_floats(const OptimizerOptions& options);

class Optimizer {
 public:
  Optimizer(std::vector<Param*> params, const OptimizerOptions& options);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Clips (when asked), applies one update from the accumulated gradients and bumps each
  // parameter's version.
  void step();
  // This step's learning rate is options().lr * scale (a schedule's factor).
  void set_lr_scale(float scale) { scale_ = scale; }
  float lr_scale() const { return scale_; }
  float lr() const { return options_.lr * scale_; }
  const OptimizerOptions& options() const { return options_; }
  // The gradients' global L2 norm before the last step's clipping (0 before any step).
  double last_grad_norm() const { return last_norm_; }
  // Per-parameter state tensors (momentum; Adam's two moments), for checkpoints.
  virtual std::vector<Tensor*> state() = 0;
  // Updates applied so far (Adam's t); a checkpoint restores it with the state tensors.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // Forgets momentum and moments (as a fresh optimizer): a federated edge does this when its
  // weights are replaced by a round's average, so its own past direction does not pull the
  // averaged weights straight back.
  void reset_state() {
    for (Tensor* t : state()) t->fill(0.0f);
    steps_ = 0;
  }

 protected:
  virtual void update(float lr) = 0;
  std::vector<Param*> params_;
  OptimizerOptions options_;
  int64_t steps_ = 0;  // updates before the current one while update() runs

 private:
  float scale_ = 1.0f;
  double last_norm_ = 0.0;
  // The gradients' pointers, lengths and squared norms for VectorKernel::squared_norms, made
  // once: a step allocates nothing.
  std::vector<const float*> norm_x_;
  std::vector<int64_t> norm_n_;
  std::vector<double> norm_out_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Param*> params, const OptimizerOptions& options);
  std::vector<Tensor*> state() override;

 private:
  void update(float lr) override;
  std::vector<Tensor> momentum_;
};

// Adam (L2 weight decay added to the gradient) or, with kind "adamw", AdamW (weights decay
// by lr * weight_decay before the Adam step).
class Adam final : public Optimizer {
 public:
  Adam(std::vector<Param*> params, const OptimizerOptions& options);
  std::vector<Tensor*> state() override;

 private:
  void update(float lr) override;
  std::vector<Tensor> m_, v_;
};

// Sgd or Adam from options.kind; throws naming the unknown kind.
std::unique_ptr<Optimizer> make_optimizer(std::vector<Param*> params, const OptimizerOptions& options);

}  // namespace tandem
