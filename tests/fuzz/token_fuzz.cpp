// Fuzzes enrolment tokens: TokenVerifier::accept (format, base64url, claims, signature,
// expiry, single use) against a CA made once in a temp dir, and parse_ttl / check_client_name.
//
// Input: a mode byte, the client id up to the first '\n', then
//   mode % 3 == 0: a token as the edge sends it;
//   mode % 3 == 1: a token payload ("client=..;id=..;iat=..;exp=..") that the harness signs with
//                  the CA's key, so the fuzzer gets past the signature to the claims' checks;
//   mode % 3 == 2: a --ttl value.
#include <mbedtls/pk.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "cloud/pki/mbed_support.h"
#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "core/error.h"
#include "core/sha256.h"

using namespace tandem;

namespace {

constexpr int64_t kNow = 1900000000;  // the clock the fuzzed tokens are checked at
constexpr const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

struct State {
  std::string dir;
  std::unique_ptr<pki::TokenVerifier> verifier;
  pki::Pk ca_key;
  pki::Random rng;
};
State* state = nullptr;

std::string base64url(std::string_view bytes) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += kAlphabet[(acc << (6 - bits)) & 63];
  return out;
}

// As pki::issue_token signs (cloud/pki/token.cpp), but any payload.
std::string sign(std::string_view payload) {
  Sha256 h;
  static constexpr char kDomain[] = "tandem enrolment token v1\n";
  h.update(kDomain, sizeof kDomain - 1);
  h.update(payload.data(), payload.size());
  const auto hash = h.finish();
  unsigned char sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
  std::size_t sig_len = 0;
  pki::check(mbedtls_pk_sign(state->ca_key.get(), MBEDTLS_MD_SHA256, hash.data(), hash.size(), sig, &sig_len,
                             mbedtls_ctr_drbg_random, state->rng.drbg()),
             "signing the fuzzed token");
  return "tdt1." + base64url(payload) + "." + base64url(std::string_view(reinterpret_cast<char*>(sig), sig_len));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/tandem-token-fuzz-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  state = new State;
  state->dir = tmpl;
  std::atexit([] { std::filesystem::remove_all(state->dir); });
  pki::init(state->dir);
  state->verifier = std::make_unique<pki::TokenVerifier>(state->dir);
  state->ca_key = pki::load_key(state->dir + "/ca.key");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::size_t nl = rest.find('\n');
  const std::string client(rest.substr(0, nl));
  const std::string body(nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1));
  try {
    switch (data[0] % 3) {
      case 0: (void)state->verifier->accept(body, client, kNow); break;
      case 1:
        if (body.size() <= 512) (void)state->verifier->accept(sign(body), client, kNow);
        break;
      default:
        (void)pki::parse_ttl(body);
        pki::check_client_name(client);
    }
  } catch (const Error&) {
    // parse_ttl and check_client_name refuse with an Error; accept never throws.
    if (data[0] % 3 != 2) std::abort();
  }
  return 0;
}
