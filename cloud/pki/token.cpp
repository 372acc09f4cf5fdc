#include "cloud/pki/token.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>

#include "cloud/pki/identities.h"
#include "cloud/pki/pki.h"
#include "core/error.h"
#include "core/sha256.h"

namespace tandem::pki {
namespace {

constexpr std::string_view kWhere = "pki";
constexpr std::string_view kPrefix = "tdt1.";
constexpr std::size_t kMaxTokenChars = 1024;
constexpr int64_t kClockSkewS = 300;  // a token "issued" this far in the future is still taken
constexpr const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

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

// False on a character outside the alphabet or an impossible length.
bool from_base64url(std::string_view text, std::string& out) {
  out.clear();
  if (text.size() % 4 == 1) return false;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const char* at = std::strchr(kAlphabet, c);
    if (c == '\0' || !at) return false;
    acc = (acc << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return true;
}

// What the CA signs: a domain separator and the payload.
std::array<uint8_t, 32> digest(std::string_view payload) {
  Sha256 h;
  static constexpr char kDomain[] = "tandem enrolment token v1\n";
  h.update(kDomain, sizeof kDomain - 1);
  h.update(payload.data(), payload.size());
  return h.finish();
}

struct Claims {
  std::string client, id;
  int64_t iat = 0, exp = 0;
};

bool parse_int(std::string_view s, int64_t& v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "client=NAME;id=HEX;iat=N;exp=N", fields in this order.
bool parse_claims(const std::string& payload, Claims& c) {
  static constexpr std::string_view kKeys[] = {"client=", "id=", "iat=", "exp="};
  std::string_view rest = payload;
  std::string_view values[4];
  for (int i = 0; i < 4; ++i) {
    if (rest.substr(0, kKeys[i].size()) != kKeys[i]) return false;
    rest.remove_prefix(kKeys[i].size());
    const std::size_t end = i < 3 ? rest.find(';') : rest.size();
    if (end == std::string_view::npos) return false;
    values[i] = rest.substr(0, end);
    rest.remove_prefix(i < 3 ? end + 1 : end);
  }
  c.client = values[0];
  c.id = values[1];
  if (c.id.size() != 32 || c.id.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  return parse_int(values[2], c.iat) && parse_int(values[3], c.exp);
}

}  // namespace

std::string issue_token(const std::string& state_dir, const std::string& client, int64_t ttl_s, int64_t now) {
  check_client_name(client);
  if (ttl_s <= 0) fail(kWhere, cat("a token's time to live must be > 0 seconds, got ", ttl_s));
  require_ca(state_dir);
  Random rng;
  Pk key = load_key(state_dir + "/ca.key");
  uint8_t id[16];
  check(mbedtls_ctr_drbg_random(rng.drbg(), id, sizeof id), "drawing a token id");
  return sign_token(key, rng, cat("client=", client, ";id=", to_hex(id, sizeof id), ";iat=", now, ";exp=", now + ttl_s));
}

std::string sign_token(const Pk& ca_key, Random& rng, std::string_view payload) {
  const auto hash = digest(payload);
  unsigned char sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
  std::size_t sig_len = 0;
  check(mbedtls_pk_sign(ca_key.get(), MBEDTLS_MD_SHA256, hash.data(), hash.size(), sig, &sig_len,
                        mbedtls_ctr_drbg_random, rng.drbg()),
        "signing the token");
  return cat(kPrefix, base64url(payload), ".", base64url(std::string_view(reinterpret_cast<char*>(sig), sig_len)));
}

int64_t parse_ttl(const std::string& text) {
  int64_t unit = 1;
  std::string_view digits = text;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 's': unit = 1; break;
      case 'm': unit = 60; break;
      case 'h': unit = 3600; break;
      case 'd': unit = 86400; break;
      default: unit = 0;
    }
    if (unit) digits.remove_suffix(1);
    else unit = 1;
  }
  int64_t v = 0;
  if (!parse_int(digits, v) || v <= 0 || v > 366 * 86400 / unit)
    fail("cli", cat("--ttl: expected a duration like 3600, 90s, 15m, 12h or 7d (at most a year), got '", text, "'"));
  return v * unit;
}

TokenVerifier::TokenVerifier(const std::string& state_dir, Veto veto)
    : ca_(load_crt(state_dir + "/ca.crt")), veto_(std::move(veto)), used_path_(state_dir + "/tokens-used") {
  std::ifstream in(used_path_);
  std::string id;
  int64_t exp = 0;
  while (in >> id >> exp) used_.insert(id);
}

std::string TokenVerifier::accept(const std::string& token, const std::string& client, int64_t now) {
  if (token.empty())
    return "no client certificate and no enrolment token: give the edge an identity (`tandem-cloud pki issue`) "
           "or a token (`tandem-cloud pki token`)";
  if (token.size() > kMaxTokenChars || token.substr(0, kPrefix.size()) != kPrefix)
    return cat("the enrolment token is malformed: it must start with '", kPrefix, "' and be at most ", kMaxTokenChars,
               " characters");
  const std::size_t dot = token.find('.', kPrefix.size());
  std::string payload, sig;
  Claims claims;
  if (dot == std::string::npos || !from_base64url(std::string_view(token).substr(kPrefix.size(), dot - kPrefix.size()), payload) ||
      !from_base64url(std::string_view(token).substr(dot + 1), sig) || !parse_claims(payload, claims))
    return "the enrolment token is malformed: expected tdt1.<payload>.<signature> as `tandem-cloud pki token` prints it";
  const auto hash = digest(payload);
  if (mbedtls_pk_verify(&ca_->pk, MBEDTLS_MD_SHA256, hash.data(), hash.size(),
                        reinterpret_cast<const unsigned char*>(sig.data()), sig.size()) != 0)
    return "the enrolment token's signature does not verify against this cloud's CA (forged, altered, or issued by "
           "another cloud)";
  if (now >= claims.exp)
    return cat("the enrolment token expired at ", utc_text(claims.exp), "; issue a new one with `tandem-cloud pki token`");
  if (claims.iat > now + kClockSkewS)
    return cat("the enrolment token was issued at ", utc_text(claims.iat),
               ", in this cloud's future: check the clocks of the machines");
  if (claims.client != client)
    return cat("the enrolment token is for client '", claims.client, "', but the edge says it is '", client, "'");
  if (veto_)
    if (std::string why = veto_(claims.client, claims.iat); !why.empty()) return why;
  std::lock_guard<std::mutex> lock(mutex_);
  if (used_.count(claims.id))
    return "the enrolment token was already used: tokens are single-use; issue a new one with `tandem-cloud pki token`";
  // Spent on disk before it is accepted: a crash cannot make it usable again.
  const std::string line = cat(claims.id, " ", claims.exp, "\n");
  const int fd = ::open(used_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  const bool written = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!written) return cat("cannot record the spent token in ", used_path_, ": ", std::strerror(errno));
  used_.insert(claims.id);
  return "";
}

}  // namespace tandem::pki
