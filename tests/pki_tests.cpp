// PKI tests: the CA and server certificate, issued edge identities that verify against their
// CA and not against another, idempotent init, and the errors users see.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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

}  // namespace
}  // namespace tandem::test
