#include "core/backend.h"

#include "core/error.h"
#include "core/host_vectors.h"

namespace tandem {

Support Backend::supports(std::string_view, std::span<const Shape>) const { return Support::yes(); }

std::unique_ptr<GroupedLinearKernel> Backend::grouped_linear(const GroupedLinearGeometry& g) {
  const Support s = supports("heads", {});
  fail(std::string(name()), cat(s.ok ? "has no grouped linear kernel" : s.why, " (asked for ", g.str(), ")"));
}

VectorKernel& Backend::vectors() { return host_vectors(); }

}  // namespace tandem
