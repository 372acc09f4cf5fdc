// PKI tests: the CA and server certificate, issued edge identities that verify against their
// CA and not against another, idempotent init, and the errors users see.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cloud/pki/identities.h"
#include "cloud/pki/pki.h"
#include "ports/crypto/certificate_name.h"
#include "core/error.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-pki-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Pki, InitMakesCaAndServerCertificateOnce) {
  TempDir dir;
  const auto r = pki::init(dir / "state");
  EXPECT_TRUE(r.created);
  EXPECT_EQ(pki::verify(r.ca_cert, r.server_cert), "");
  EXPECT_EQ(certificate_common_name(r.server_cert), "tandem-cloud");
  EXPECT_EQ(certificate_common_name(r.ca_cert), "tandem CA");
  struct stat st {};
  ASSERT_EQ(stat((dir / "state/ca.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(r.server_key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string ca_before = slurp(r.ca_cert);
  const auto again = pki::init(dir / "state");
  EXPECT_FALSE(again.created);
  EXPECT_EQ(slurp(r.ca_cert), ca_before);
}

TEST(Pki, IssuedIdentityVerifiesAgainstItsCaOnly) {
  TempDir dir;
  pki::init(dir / "state");
  pki::issue(dir / "state", "hospital-a", dir / "edge-a");
  EXPECT_EQ(pki::verify(dir / "state/ca.crt", dir / "edge-a/client.crt"), "");
  EXPECT_EQ(certificate_common_name(dir / "edge-a/client.crt"), "hospital-a");
  EXPECT_EQ(slurp(dir / "edge-a/ca.crt"), slurp(dir / "state/ca.crt"));

  pki::init(dir / "other");
  pki::issue(dir / "other", "intruder", dir / "edge-x");
  const std::string why = pki::verify(dir / "state/ca.crt", dir / "edge-x/client.crt");
  EXPECT_NE(why.find("not correctly signed by the trusted CA"), std::string::npos) << why;
}

TEST(Pki, IssueWithoutCaSaysWhatToDo) {
  TempDir dir;
  try {
    pki::issue(dir / "empty", "a", dir / "out");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[pki] " + (dir / "empty") + " has no CA; run `tandem-cloud pki init --state-dir " +
                                         (dir / "empty") + "` first");
  }
}

TEST(Pki, BadClientNameIsRefused) {
  TempDir dir;
  pki::init(dir / "state");
  try {
    pki::issue(dir / "state", "a/../b", dir / "out");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[pki] client name 'a/../b' may hold only letters, digits, '-', '_' and '.'");
  }
}

TEST(Pki, CommandLine) {
  TempDir dir;
  const std::string bin = TANDEM_CLOUD_BIN;
  ASSERT_EQ(std::system((bin + " pki init --state-dir " + (dir / "s") + " > /dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " pki issue --state-dir " + (dir / "s") + " --client edge1 --out " + (dir / "id") +
                         " > /dev/null")
                            .c_str()),
            0);
  EXPECT_EQ(pki::verify(dir / "s/ca.crt", dir / "id/client.crt"), "");
  EXPECT_NE(std::system((bin + " pki issue --state-dir " + (dir / "s") + " --out x 2> /dev/null").c_str()), 0);
}

// The register and the revocation list: a revoked client's certificates are refused by serial,
// one with its name that the register does not know too, one issued after the revocation is
// not; tokens issued until the revocation are refused; a running list sees a later revoke.
TEST(Pki, RevocationRefusesWhatWasIssuedUntilThen) {
  TempDir dir;
  const std::string state = dir / "state";
  pki::init(state);
  pki::issue(state, "alice", dir / "alice");
  pki::issue(state, "bob", dir / "bob");
  const auto issued = pki::issued_certificates(state);
  ASSERT_EQ(issued.size(), 2u);
  EXPECT_EQ(issued[0].client, "alice");
  EXPECT_EQ(issued[0].serial, pki::normalize_serial(issued[0].serial));
  EXPECT_GT(issued[0].not_after, issued[0].issued_at + 700 * 86400);
  const std::string alice = issued[0].serial, bob = issued[1].serial;

  pki::RevocationList list(state);
  EXPECT_EQ(list.refuses_certificate("alice", alice), "");
  const pki::Revocation r = pki::revoke(state, "alice", 1000);
  ASSERT_EQ(r.serials, std::vector<std::string>{alice});
  const std::string why = list.refuses_certificate("alice", alice);  // reread: the file changed
  EXPECT_EQ(why.rfind("the certificate of 'alice' (serial " + alice + ") was revoked on 1970-01-01 00:16:40 UTC", 0), 0u)
      << why;
  EXPECT_EQ(list.refuses_certificate("bob", bob), "");
  EXPECT_NE(list.refuses_certificate("alice", "1234abcd"), "") << "a name revoked, a serial the register does not know";
  EXPECT_NE(list.refuses_certificate("mallory", alice), "") << "alice's serial under any name";
  EXPECT_EQ(list.refuses_token("alice", 1001), "");
  EXPECT_EQ(list.refuses_token("alice", 999),
            "the enrolment token was issued to 'alice' at 1970-01-01 00:16:39 UTC, before 'alice' was revoked on "
            "1970-01-01 00:16:40 UTC; ask the cloud's operator for a new token");
  EXPECT_NE(list.refuses_session("alice", 900), "");
  EXPECT_EQ(list.refuses_session("alice", 1001), "");

  pki::issue(state, "alice", dir / "alice2");  // a new identity after the revocation works
  const std::string alice2 = pki::issued_certificates(state).back().serial;
  EXPECT_EQ(list.refuses_certificate("alice", alice2), "");
  EXPECT_NE(list.refuses_certificate("alice", alice), "");
  EXPECT_EQ(pki::RevocationList(state).refuses_certificate("alice", alice2), "") << "as a restarted cloud reads it";
  EXPECT_EQ(pki::normalize_serial("00:0A:bC"), "abc");
  EXPECT_EQ(pki::normalize_serial("000"), "0");
}

// The CLI: revoke and list say what happened.
TEST(Pki, RevokeAndListOnTheCommandLine) {
  TempDir dir;
  const std::string bin = TANDEM_CLOUD_BIN, state = dir / "s";
  ASSERT_EQ(std::system((bin + " pki init --state-dir " + state + " > /dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " pki issue --state-dir " + state + " --client ward-1 --out " + (dir / "w") + " > /dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " pki revoke --state-dir " + state + " --client ward-1 > " + (dir / "revoke.txt")).c_str()), 0);
  EXPECT_NE(slurp(dir / "revoke.txt").find("revoked 'ward-1' at "), std::string::npos) << slurp(dir / "revoke.txt");
  ASSERT_EQ(std::system((bin + " pki list --state-dir " + state + " > " + (dir / "list.txt")).c_str()), 0);
  const std::string list = slurp(dir / "list.txt");
  EXPECT_NE(list.find("ward-1"), std::string::npos) << list;
  EXPECT_NE(list.find(" revoked "), std::string::npos) << list;
  EXPECT_NE(std::system((bin + " pki revoke --state-dir " + state + " --client 'bad name' 2> /dev/null").c_str()), 0);
}

}  // namespace
}  // namespace tandem::test
