// The XNNPACK backend (edge): forward and backward of the FLOP-heavy ops through XNNPACK
// operators, created once per shape; registers itself as "xnnpack".
#pragma once

#include <memory>

#include "core/backend.h"

namespace tandem {

std::unique_ptr<Backend> make_xnnpack_backend(const BackendOptions& options);
void register_xnnpack_backend();

}  // namespace tandem
