// Fuzzes enrolment tokens: TokenVerifier::accept (format, base64url, claims, signature,
// expiry, single use) against a CA made once in a temp dir, and parse_ttl / check_client_name.
//
// Input: a mode byte, the client id up to the first '\n', then
//   mode % 3 == 0: a token as the edge sends it;
//   mode % 3 == 1: a token payload ("client=..;id=..;iat=..;exp=..") that the harness signs with
//                  the CA's key, so the fuzzer gets past the signature to the claims' checks;
//   mode % 3 == 2: a --ttl value.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "cloud/pki/mbed_support.h"
#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "core/error.h"

using namespace tandem;

namespace {

constexpr int64_t kNow = 1900000000;  // the clock the fuzzed tokens are checked at

struct State {
  std::string dir;
  std::unique_ptr<pki::TokenVerifier> verifier;
  pki::Pk ca_key;
  pki::Random rng;
};
State* state = nullptr;

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
        if (body.size() <= 512) (void)state->verifier->accept(pki::sign_token(state->ca_key, state->rng, body), client, kNow);
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
