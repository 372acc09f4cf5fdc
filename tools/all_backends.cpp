#include "tools/all_backends.h"

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

}  // namespace tandem
