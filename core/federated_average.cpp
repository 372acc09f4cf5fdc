#include "core/federated_average.h"

#include "core/error.h"

namespace tandem {

void federated_average(std::span<const std::vector<Tensor>* const> parts, std::span<const uint64_t> samples,
                       std::span<Tensor> out) {
  if (parts.empty() || parts.size() != samples.size()) fail("federated average", "one sample count a part, at least one part");
  uint64_t total = 0;
  for (uint64_t s : samples) total += s;
  std::vector<double> acc;
  for (std::size_t k = 0; k < out.size(); ++k) {
    acc.assign(static_cast<std::size_t>(out[k].numel()), 0.0);
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const double weight = total > 0 ? static_cast<double>(samples[p]) / static_cast<double>(total)
                                      : 1.0 / static_cast<double>(parts.size());
      const float* v = (*parts[p])[k].data();
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += weight * v[i];
    }
    for (std::size_t i = 0; i < acc.size(); ++i) out[k].data()[i] = static_cast<float>(acc[i]);
  }
}

}  // namespace tandem
