// The XNNPACK backend (edge): forward and backward of the FLOP-heavy ops through XNNPACK
// operators, created once per shape; the registry names it "xnnpack".
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem {

std::unique_ptr<Backend> make_xnnpack_backend(const BackendOptions& options);

}  // namespace tandem
