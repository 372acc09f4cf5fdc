#include "cloud/pki/mbed_support.h"

#include <fcntl.h>
#include <mbedtls/error.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tandem::pki {
namespace {
constexpr std::string_view kWhere = "pki";
}  // namespace

std::string mbed_error(int code) {
  char buf[160];
  mbedtls_strerror(code, buf, sizeof buf);
  return cat(buf, " (-0x", std::hex, -code, ")");
}

void check(int rc, const char* what) {
  if (rc != 0) fail(kWhere, cat(what, " failed: ", mbed_error(rc)));
}

void PkFree::operator()(mbedtls_pk_context* p) const {
  mbedtls_pk_free(p);
  delete p;
}

Pk new_pk() {
  Pk pk(new mbedtls_pk_context);
  mbedtls_pk_init(pk.get());
  return pk;
}

void CrtFree::operator()(mbedtls_x509_crt* p) const {
  mbedtls_x509_crt_free(p);
  delete p;
}

Crt load_crt(const std::string& path) {
  Crt crt(new mbedtls_x509_crt);
  mbedtls_x509_crt_init(crt.get());
  check(mbedtls_x509_crt_parse_file(crt.get(), path.c_str()), cat("reading certificate ", path).c_str());
  return crt;
}

Random::Random() {
  mbedtls_entropy_init(&entropy_);
  mbedtls_ctr_drbg_init(&drbg_);
  const char* personal = "tandem-pki";
  check(mbedtls_ctr_drbg_seed(&drbg_, mbedtls_entropy_func, &entropy_, reinterpret_cast<const unsigned char*>(personal),
                              std::strlen(personal)),
        "seeding the random generator");
}

Random::~Random() {
  mbedtls_ctr_drbg_free(&drbg_);
  mbedtls_entropy_free(&entropy_);
}

Pk generate_key(Random& rng) {
  Pk pk = new_pk();
  check(mbedtls_pk_setup(pk.get(), mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)), "key setup");
  check(mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(*pk), mbedtls_ctr_drbg_random, rng.drbg()),
        "generating an EC P-256 key");
  return pk;
}

Pk load_key(const std::string& path) {
  Pk pk = new_pk();
  check(mbedtls_pk_parse_keyfile(pk.get(), path.c_str(), nullptr), cat("reading key ", path).c_str());
  return pk;
}

void write_atomically(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) fail(kWhere, cat("cannot write ", tmp, ": ", std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      ::close(fd);
      fail(kWhere, cat("cannot write ", tmp, ": ", std::strerror(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail(kWhere, cat("cannot sync ", tmp, ": ", std::strerror(errno)));
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(kWhere, cat("cannot rename ", tmp, ": ", std::strerror(errno)));
}

}  // namespace tandem::pki
