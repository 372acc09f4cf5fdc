#include "tools/all_backends.h"

#include <algorithm>

#include "core/backend.h"

#ifdef TANDEM_HAVE_XNNPACK
#include "edge/xnnpack/xnnpack_backend.h"
#endif
#ifdef TANDEM_HAVE_ONEDNN
#include "cloud/onednn/onednn_backend.h"
#endif

namespace tandem {

void register_built_backends() {
#ifdef TANDEM_HAVE_XNNPACK
  register_xnnpack_backend();
#endif
#ifdef TANDEM_HAVE_ONEDNN
  register_onednn_backend();
#endif
}

std::string preferred_backend(const std::string& preferred) {
  const auto names = backend_names();
  return std::find(names.begin(), names.end(), preferred) != names.end() ? preferred : "reference";
}

}  // namespace tandem
