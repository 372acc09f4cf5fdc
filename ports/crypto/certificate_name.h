// The common name (CN) of an X.509 certificate in a PEM file, as the cloud reads it from the
// TLS handshake: an edge's client id is its certificate's CN.
#pragma once

#include <string>

namespace tandem {

// Throws Error naming the file when it cannot be read or parsed, or has no CN.
std::string certificate_common_name(const std::string& pem_path);

}  // namespace tandem
