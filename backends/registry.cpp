#include "backends/registry.h"

#include <algorithm>

#include "backends/portable/portable_backend.h"
#include "backends/reference/reference_backend.h"
#include "core/error.h"
#ifdef TANDEM_HAVE_XNNPACK
#include "backends/xnnpack/xnnpack_backend.h"
#endif
#ifdef TANDEM_HAVE_ONEDNN
#include "backends/onednn/onednn_backend.h"
#endif

namespace tandem {
namespace {

using Factory = std::unique_ptr<Backend> (*)(const BackendOptions&);

struct Entry {
  std::string_view name;
  Factory make;
};

// A fixed table: which backends exist is decided when the build is configured.
constexpr Entry kBackends[] = {
    {"reference", make_reference_backend},
    {"portable", make_portable_backend},
#ifdef TANDEM_HAVE_XNNPACK
    {"xnnpack", make_xnnpack_backend},
#endif
#ifdef TANDEM_HAVE_ONEDNN
    {"onednn", make_onednn_backend},
#endif
};

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Entry& e : kBackends) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  for (const Entry& e : kBackends)
    if (e.name == name) return e.make(options);
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  fail("backend", cat("unknown backend '", name, "'; this build has: ", known));
}

std::string preferred_backend(const std::string& preferred) {
  const auto names = backend_names();
  return std::find(names.begin(), names.end(), preferred) != names.end() ? preferred : "reference";
}

}  // namespace tandem
