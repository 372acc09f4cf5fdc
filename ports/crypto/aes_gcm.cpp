#include "ports/crypto/aes_gcm.h"

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/gcm.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/sha256.h"
#include "ports/files/atomic_file.h"

namespace tandem {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'M', 'S', 'E', 'A', 'L', '1'};
constexpr std::size_t kNonce = 12, kTag = 16;

struct GcmDeleter {
  void operator()(mbedtls_gcm_context* c) const {
    mbedtls_gcm_free(c);
    delete c;
  }
};
using Gcm = std::unique_ptr<mbedtls_gcm_context, GcmDeleter>;

Gcm make_gcm(const AesKey& key) {
  Gcm g(new mbedtls_gcm_context);
  mbedtls_gcm_init(g.get());
  if (mbedtls_gcm_setkey(g.get(), MBEDTLS_CIPHER_ID_AES, key.data(), 256) != 0) fail("aes-gcm", "cannot set the key");
  return g;
}

void random_bytes(uint8_t* out, std::size_t n) {
  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
  mbedtls_entropy_init(&entropy);
  mbedtls_ctr_drbg_init(&drbg);
  static const char kPersonal[] = "tandem-aes-gcm";
  const int rc = mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy,
                                       reinterpret_cast<const unsigned char*>(kPersonal), sizeof kPersonal - 1);
  const int rc2 = rc == 0 ? mbedtls_ctr_drbg_random(&drbg, out, n) : rc;
  mbedtls_ctr_drbg_free(&drbg);
  mbedtls_entropy_free(&entropy);
  if (rc2 != 0) fail("aes-gcm", "the random generator failed");
}

}  // namespace

bool is_sealed(std::span<const uint8_t> bytes) {
  return bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0;
}

std::vector<uint8_t> seal_aes_gcm(const AesKey& key, std::span<const uint8_t> plaintext) {
  std::vector<uint8_t> out(sizeof kMagic + kNonce + plaintext.size() + kTag);
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  uint8_t* nonce = out.data() + sizeof kMagic;
  random_bytes(nonce, kNonce);
  uint8_t* body = nonce + kNonce;
  Gcm g = make_gcm(key);
  // The magic is authenticated too, so a sealed file cannot be relabelled.
  if (mbedtls_gcm_crypt_and_tag(g.get(), MBEDTLS_GCM_ENCRYPT, plaintext.size(), nonce, kNonce, out.data(),
                                sizeof kMagic, plaintext.data(), body, kTag, body + plaintext.size()) != 0)
    fail("aes-gcm", "encryption failed");
  return out;
}

std::vector<uint8_t> open_aes_gcm(const AesKey& key, std::span<const uint8_t> sealed) {
  if (!is_sealed(sealed)) fail("aes-gcm", "not an encrypted tandem file");
  if (sealed.size() < sizeof kMagic + kNonce + kTag) fail("aes-gcm", "truncated: shorter than its nonce and tag");
  const std::size_t n = sealed.size() - sizeof kMagic - kNonce - kTag;
  const uint8_t* nonce = sealed.data() + sizeof kMagic;
  const uint8_t* body = nonce + kNonce;
  std::vector<uint8_t> out(n);
  Gcm g = make_gcm(key);
  if (mbedtls_gcm_auth_decrypt(g.get(), n, nonce, kNonce, sealed.data(), sizeof kMagic, body + n, kTag, body,
                               out.data()) != 0)
    fail("aes-gcm", "authentication failed: the file was changed or truncated, or the key is not the one it was "
                    "written with");
  return out;
}

AesKey random_key() {
  AesKey k;
  random_bytes(k.data(), k.size());
  return k;
}

AesKey load_key(const std::string& path, bool create) {
  std::ifstream in(path);
  if (!in) {
    if (!create) fail("aes-gcm", cat("no key file ", path));
    const AesKey k = random_key();
    const std::string hex = to_hex(k.data(), k.size()) + "\n";
    write_file_atomic(path, std::span(reinterpret_cast<const uint8_t*>(hex.data()), hex.size()));
    ::chmod(path.c_str(), 0600);
    return k;
  }
  std::string hex;
  in >> hex;
  if (hex.size() != 64) fail("aes-gcm", cat("the key file ", path, " must hold 64 hex digits"));
  AesKey k;
  for (std::size_t i = 0; i < 32; ++i) {
    unsigned v = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = hex[2 * i + static_cast<std::size_t>(j)];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) fail("aes-gcm", cat("the key file ", path, " must hold 64 lower-case hex digits"));
      v = v * 16 + static_cast<unsigned>(d);
    }
    k[i] = static_cast<uint8_t>(v);
  }
  return k;
}

}  // namespace tandem
