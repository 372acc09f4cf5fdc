// An elementwise activation beyond ReLU as its op definition (core/ops) gives it: PyTorch's
// forward and the gradient it backpropagates, for the backends' portable loops. A backend
// with a library kernel for one looks it up by name, and falls back to these loops.
#pragma once

#include <string_view>

namespace tandem {

struct Activation {
  std::string_view name;
  float (*forward)(float x);
  // dx = dy * f'(x); y = f(x) is given too, and holds f(x) only when backward_reads_output
  // (sigmoid and tanh): otherwise its storage may have served another tensor since
  // (Layer::backward_reads), so a backend reads it only for those.
  float (*backward)(float x, float y, float dy);
  bool backward_reads_output = false;
};

// The activation op of that name (relu6, hardswish, gelu, sigmoid, tanh, silu, ...), or null.
const Activation* find_activation(std::string_view op);

}  // namespace tandem
