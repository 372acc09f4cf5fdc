// The oneDNN backend (cloud): forward and backward primitives of oneDNN, created once per
// shape with NHWC/OHWI memory; the registry names it "onednn".
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem {

std::unique_ptr<Backend> make_onednn_backend(const BackendOptions& options);

}  // namespace tandem
