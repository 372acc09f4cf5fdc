// mbedTLS helpers shared by the PKI and the enrolment tokens: error text, owned contexts, a
// seeded random generator, key and certificate loading, atomic file writes.
#pragma once

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>
#include <sys/types.h>

#include <memory>
#include <string>

namespace tandem::pki {

// "what failed: mbedTLS's text (-0xCODE)".
std::string mbed_error(int code);
// Throws Error("pki", ...) unless rc is 0.
void check(int rc, const char* what);

struct PkFree {
  void operator()(mbedtls_pk_context* p) const;
};
using Pk = std::unique_ptr<mbedtls_pk_context, PkFree>;
Pk new_pk();

struct CrtFree {
  void operator()(mbedtls_x509_crt* p) const;
};
using Crt = std::unique_ptr<mbedtls_x509_crt, CrtFree>;
Crt load_crt(const std::string& path);

// CTR-DRBG seeded from the system's entropy.
class Random {
 public:
  Random();
  ~Random();
  Random(const Random&) = delete;
  Random& operator=(const Random&) = delete;
  mbedtls_ctr_drbg_context* drbg() { return &drbg_; }

 private:
  mbedtls_entropy_context entropy_;
  mbedtls_ctr_drbg_context drbg_;
};

Pk generate_key(Random& rng);  // EC P-256
Pk load_key(const std::string& path);

// Writes `text` to `path` via a temporary file, fsync and rename, with `mode` permissions.
void write_atomically(const std::string& path, const std::string& text, mode_t mode);

}  // namespace tandem::pki
