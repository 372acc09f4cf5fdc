// Enrolment tokens: a genuine token is taken once; forged, altered, foreign, expired,
// future-dated, mistargeted, malformed and replayed ones are refused with the exact reason,
// and spent tokens stay spent across a restart.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "core/error.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

struct State {
  fs::path dir;
  State() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-token-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
    pki::init((dir / "cloud").string());
    pki::init((dir / "other").string());
  }
  ~State() { fs::remove_all(dir); }
  std::string cloud() const { return (dir / "cloud").string(); }
  std::string other() const { return (dir / "other").string(); }
};

constexpr const char* kForged =
    "the enrolment token's signature does not verify against this cloud's CA (forged, altered, or issued by another "
    "cloud)";
constexpr const char* kMalformed =
    "the enrolment token is malformed: expected tdt1.<payload>.<signature> as `tandem-cloud pki token` prints it";

std::string b64url(const std::string& bytes) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    for (bits += 8; bits >= 6; bits -= 6) out += a[(acc >> (bits - 6)) & 63];
  }
  if (bits > 0) out += a[(acc << (6 - bits)) & 63];
  return out;
}

std::string signature_of(const std::string& token) { return token.substr(token.rfind('.')); }

TEST(Token, GenuineTokenIsTakenOnceAndStaysSpentAfterARestart) {
  State s;
  const std::string token = pki::issue_token(s.cloud(), "browser-1", 3600);
  EXPECT_EQ(token.rfind("tdt1.", 0), 0u) << token;
  auto verifier = std::make_unique<pki::TokenVerifier>(s.cloud());
  EXPECT_EQ(verifier->accept(token, "browser-1"), "");
  const std::string replayed =
      "the enrolment token was already used: tokens are single-use; issue a new one with `tandem-cloud pki token`";
  EXPECT_EQ(verifier->accept(token, "browser-1"), replayed);
  verifier = std::make_unique<pki::TokenVerifier>(s.cloud());  // the cloud restarted
  EXPECT_EQ(verifier->accept(token, "browser-1"), replayed);
  EXPECT_EQ(verifier->accept(pki::issue_token(s.cloud(), "browser-1", 3600), "browser-1"), "");
}

TEST(Token, ForgedAlteredAndForeignTokensAreRefused) {
  State s;
  pki::TokenVerifier verifier(s.cloud());
  const std::string token = pki::issue_token(s.cloud(), "browser-1", 3600);
  // Another cloud's CA signed it.
  EXPECT_EQ(verifier.accept(pki::issue_token(s.other(), "browser-1", 3600), "browser-1"), kForged);
  // One character of the signature changed.
  std::string flipped = token;
  flipped[flipped.size() - 5] = flipped[flipped.size() - 5] == 'A' ? 'B' : 'A';
  EXPECT_EQ(verifier.accept(flipped, "browser-1"), kForged);
  // A longer expiry written into the payload, the signature kept.
  const long now = static_cast<long>(std::time(nullptr));
  char payload[200];
  std::snprintf(payload, sizeof payload, "client=browser-1;id=0123456789abcdef0123456789abcdef;iat=%ld;exp=%ld", now,
                now + 10 * 365 * 86400L);
  EXPECT_EQ(verifier.accept("tdt1." + b64url(payload) + signature_of(token), "browser-1"), kForged);
  // Another client's payload with this token's signature.
  const std::string other = pki::issue_token(s.cloud(), "browser-2", 3600);
  EXPECT_EQ(verifier.accept(other.substr(0, other.rfind('.')) + signature_of(token), "browser-2"), kForged);
  // The genuine one still works: refusals spend nothing.
  EXPECT_EQ(verifier.accept(token, "browser-1"), "");
}

TEST(Token, ExpiredFutureAndMistargetedTokensAreRefused) {
  State s;
  pki::TokenVerifier verifier(s.cloud());
  const int64_t t0 = 1'800'000'000;  // 2027-01-15 08:00:00 UTC
  EXPECT_EQ(verifier.accept(pki::issue_token(s.cloud(), "b", 60, t0), "b", t0 + 60),
            "the enrolment token expired at 2027-01-15 08:01:00 UTC; issue a new one with `tandem-cloud pki token`");
  EXPECT_EQ(verifier.accept(pki::issue_token(s.cloud(), "b", 60, t0 + 3600), "b", t0),
            "the enrolment token was issued at 2027-01-15 09:00:00 UTC, in this cloud's future: check the clocks of "
            "the machines");
  EXPECT_EQ(verifier.accept(pki::issue_token(s.cloud(), "b", 60, t0), "c", t0 + 1),
            "the enrolment token is for client 'b', but the edge says it is 'c'");
  EXPECT_EQ(verifier.accept(pki::issue_token(s.cloud(), "b", 60, t0 + 200), "b", t0), "");  // within the clock skew
}

TEST(Token, MalformedTokensAreRefused) {
  State s;
  pki::TokenVerifier verifier(s.cloud());
  EXPECT_EQ(verifier.accept("", "b"),
            "no client certificate and no enrolment token: give the edge an identity (`tandem-cloud pki issue`) or a "
            "token (`tandem-cloud pki token`)");
  EXPECT_EQ(verifier.accept("Bearer abc", "b"),
            "the enrolment token is malformed: it must start with 'tdt1.' and be at most 1024 characters");
  EXPECT_EQ(verifier.accept("tdt1." + std::string(2000, 'A'), "b"),
            "the enrolment token is malformed: it must start with 'tdt1.' and be at most 1024 characters");
  for (const std::string& bad : std::vector<std::string>{"tdt1.", "tdt1.abc", "tdt1.a!b.c", "tdt1." + b64url("client=b;id=xyz;iat=1;exp=2") + ".AAAA",
                                "tdt1." + b64url("client=b;iat=1;exp=2") + ".AAAA", "tdt1.A.AAAA"})
    EXPECT_EQ(verifier.accept(bad, "b"), kMalformed) << bad;
}

TEST(Token, TimeToLiveAndCommandLine) {
  EXPECT_EQ(pki::parse_ttl("90"), 90);
  EXPECT_EQ(pki::parse_ttl("15m"), 900);
  EXPECT_EQ(pki::parse_ttl("12h"), 43200);
  EXPECT_EQ(pki::parse_ttl("7d"), 604800);
  for (const char* bad : {"", "0", "-5", "1w", "2y", "400d", "h"}) {
    try {
      pki::parse_ttl(bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("[cli] --ttl: expected a duration like 3600, 90s, 15m, 12h or 7d (at most a year), got '") +
                    bad + "'");
    }
  }
  State s;
  const std::string cmd = std::string(TANDEM_CLOUD_BIN) + " pki token --state-dir " + s.cloud() +
                          " --client ward-7 --ttl 10m";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[2048] = {};
  ASSERT_NE(std::fgets(line, sizeof line, p), nullptr);
  EXPECT_EQ(pclose(p), 0);
  std::string token = line;
  ASSERT_EQ(token.back(), '\n');
  token.pop_back();
  pki::TokenVerifier verifier(s.cloud());
  EXPECT_EQ(verifier.accept(token, "ward-7"), "");
  try {
    pki::issue_token((s.dir / "none").string(), "b", 60);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[pki] " + (s.dir / "none").string() +
                                         " has no CA; run `tandem-cloud pki init --state-dir " +
                                         (s.dir / "none").string() + "` first");
  }
}

}  // namespace
}  // namespace tandem::test
