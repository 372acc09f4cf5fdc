#include "core/backend.h"

#include <map>
#include <mutex>

#include "core/error.h"
#include "core/portable/portable_backend.h"
#include "core/reference/reference_backend.h"

namespace tandem {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory, std::less<>> factories{
      {"reference", make_reference_backend}, {"portable", make_portable_backend}};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_backend(std::string name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[std::move(name)] = std::move(factory);
}

std::unique_ptr<GroupedLinearKernel> Backend::grouped_linear(const GroupedLinearGeometry& g) {
  fail(std::string(name()), cat("has no grouped linear kernel (for heads, which run in the cloud: use onednn or "
                                "reference) for ", g.str()));
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.factories) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
    fail("backend", cat("unknown backend '", name, "'; this build has: ", known));
  }
  return factory(options);
}

}  // namespace tandem
