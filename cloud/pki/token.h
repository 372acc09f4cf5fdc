// Enrolment tokens for edges that cannot present a client certificate (browsers): a client
// name, a random id and an expiry, signed with the cloud CA's key; single use, spent on disk.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "cloud/pki/mbed_support.h"

namespace tandem::pki {

// "tdt1.<payload>.<signature>", both base64url; the payload reads
// "client=NAME;id=HEX;iat=UNIX;exp=UNIX". Throws Error if DIR has no CA or ttl_s <= 0.
std::string issue_token(const std::string& state_dir, const std::string& client, int64_t ttl_s,
                        int64_t now = std::time(nullptr));

// The signed form of any payload, as issue_token makes it: "tdt1.<payload>.<signature>" with
// `ca_key`'s signature. For tools and fuzzers that need tokens with chosen claims.
std::string sign_token(const Pk& ca_key, Random& rng, std::string_view payload);

// Parses a --ttl value: seconds, or a number with s, m, h or d. Throws Error otherwise.
int64_t parse_ttl(const std::string& text);

// Checks tokens against DIR's CA and spends them in DIR/tokens-used (one "ID EXPIRY" line
// each, appended and fsynced before the token is accepted), so a restart forgets none.
class TokenVerifier {
 public:
  // `veto` (optional) may refuse a genuine token, by its client and issue time: the
  // revocation list (RevocationList::refuses_token). "" lets it through.
  using Veto = std::function<std::string(const std::string& client, int64_t issued_at)>;
  explicit TokenVerifier(const std::string& state_dir, Veto veto = {});
  // "" when `token` is genuine, unexpired, unspent and names `client` (it is now spent);
  // otherwise why it is refused. Thread-safe.
  std::string accept(const std::string& token, const std::string& client, int64_t now = std::time(nullptr));

 private:
  Crt ca_;
  Veto veto_;
  std::string used_path_;
  std::mutex mutex_;
  std::set<std::string> used_;
};

}  // namespace tandem::pki
