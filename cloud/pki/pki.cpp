#include "cloud/pki/pki.h"

#include <fcntl.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <arpa/inet.h>

#include <ctime>
#include <filesystem>
#include <memory>

#include "cloud/pki/identities.h"
#include "cloud/pki/mbed_support.h"
#include "core/error.h"
#include "core/sha256.h"

namespace tandem::pki {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kWhere = "pki";

struct WriteCrtFree {
  void operator()(mbedtls_x509write_cert* p) const {
    mbedtls_x509write_crt_free(p);
    delete p;
  }
};

std::string key_pem(mbedtls_pk_context* pk) {
  std::string buf(16000, '\0');
  check(mbedtls_pk_write_key_pem(pk, reinterpret_cast<unsigned char*>(buf.data()), buf.size()), "writing a key");
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

std::string utc(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", &tm);
  return buf;
}

// subjectAltName: DER SEQUENCE of dNSName [2] / iPAddress [7] entries.
std::string alt_names_der(const std::vector<std::string>& hosts) {
  std::string items;
  for (const auto& h : hosts) {
    in_addr v4{};
    if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
      items += static_cast<char>(0x87);
      items += static_cast<char>(4);
      items.append(reinterpret_cast<const char*>(&v4), 4);
    } else {
      if (h.size() > 127) fail(kWhere, cat("host name too long: ", h));
      items += static_cast<char>(0x82);
      items += static_cast<char>(h.size());
      items += h;
    }
  }
  if (items.size() > 127) fail(kWhere, "too many host names for the certificate");
  return std::string(1, '\x30') + static_cast<char>(items.size()) + items;
}

struct CertSpec {
  std::string subject;  // "CN=...,O=tandem"
  bool ca = false;
  std::vector<std::string> hosts;  // server names (subjectAltName), empty for others
  int years = 10;
  std::time_t now = std::time(nullptr);
  std::time_t not_after() const { return now + static_cast<std::time_t>(years) * 365 * 86400; }
};

// The certificate's PEM; `serial` (if given) receives its serial number in hex.
std::string make_cert(const CertSpec& spec, mbedtls_pk_context* subject_key, mbedtls_pk_context* issuer_key,
                      const std::string& issuer_name, Random& rng, std::string* serial_hex = nullptr) {
  std::unique_ptr<mbedtls_x509write_cert, WriteCrtFree> crt(new mbedtls_x509write_cert);
  mbedtls_x509write_crt_init(crt.get());
  mbedtls_x509write_crt_set_version(crt.get(), MBEDTLS_X509_CRT_VERSION_3);
  mbedtls_x509write_crt_set_md_alg(crt.get(), MBEDTLS_MD_SHA256);
  mbedtls_x509write_crt_set_subject_key(crt.get(), subject_key);
  mbedtls_x509write_crt_set_issuer_key(crt.get(), issuer_key);
  check(mbedtls_x509write_crt_set_subject_name(crt.get(), spec.subject.c_str()), "setting the subject");
  check(mbedtls_x509write_crt_set_issuer_name(crt.get(), issuer_name.c_str()), "setting the issuer");
  unsigned char serial_bytes[16];
  check(mbedtls_ctr_drbg_random(rng.drbg(), serial_bytes, sizeof serial_bytes), "drawing a serial number");
  serial_bytes[0] &= 0x7f;  // positive
  if (serial_hex) *serial_hex = normalize_serial(to_hex(serial_bytes, sizeof serial_bytes));
  mbedtls_mpi serial;
  mbedtls_mpi_init(&serial);
  const int rc = mbedtls_mpi_read_binary(&serial, serial_bytes, sizeof serial_bytes);
  if (rc == 0) check(mbedtls_x509write_crt_set_serial(crt.get(), &serial), "setting the serial number");
  mbedtls_mpi_free(&serial);
  check(rc, "reading the serial number");
  check(mbedtls_x509write_crt_set_validity(crt.get(), utc(spec.now - 3600).c_str(), utc(spec.not_after()).c_str()),
        "setting the validity");
  check(mbedtls_x509write_crt_set_basic_constraints(crt.get(), spec.ca ? 1 : 0, spec.ca ? 0 : -1),
        "setting basic constraints");
  check(mbedtls_x509write_crt_set_subject_key_identifier(crt.get()), "setting the subject key identifier");
  check(mbedtls_x509write_crt_set_authority_key_identifier(crt.get()), "setting the authority key identifier");
  check(mbedtls_x509write_crt_set_key_usage(crt.get(), spec.ca ? MBEDTLS_X509_KU_KEY_CERT_SIGN | MBEDTLS_X509_KU_CRL_SIGN
                                                               : MBEDTLS_X509_KU_DIGITAL_SIGNATURE |
                                                                     MBEDTLS_X509_KU_KEY_AGREEMENT),
        "setting key usage");
  if (!spec.hosts.empty()) {
    const std::string der = alt_names_der(spec.hosts);
    check(mbedtls_x509write_crt_set_extension(crt.get(), MBEDTLS_OID_SUBJECT_ALT_NAME,
                                              MBEDTLS_OID_SIZE(MBEDTLS_OID_SUBJECT_ALT_NAME), 0,
                                              reinterpret_cast<const unsigned char*>(der.data()), der.size()),
          "setting subjectAltName");
  }
  std::string pem(8192, '\0');
  check(mbedtls_x509write_crt_pem(crt.get(), reinterpret_cast<unsigned char*>(pem.data()), pem.size(),
                                  mbedtls_ctr_drbg_random, rng.drbg()),
        "signing the certificate");
  pem.resize(std::strlen(pem.c_str()));
  return pem;
}

constexpr const char* kCaSubject = "CN=tandem CA,O=tandem";

}  // namespace

void check_client_name(const std::string& name) {
  if (name.empty() || name.size() > 64) fail(kWhere, "client name must have 1 to 64 characters");
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      fail(kWhere, cat("client name '", name, "' may hold only letters, digits, '-', '_' and '.'"));
}

InitResult init(const std::string& state_dir, const std::vector<std::string>& hosts) {
  InitResult r;
  r.ca_cert = state_dir + "/ca.crt";
  r.server_cert = state_dir + "/server.crt";
  r.server_key = state_dir + "/server.key";
  const std::string ca_key = state_dir + "/ca.key";
  if (fs::exists(r.ca_cert) && fs::exists(ca_key) && fs::exists(r.server_cert) && fs::exists(r.server_key)) return r;
  if (fs::exists(r.ca_cert) || fs::exists(ca_key))
    fail(kWhere, cat(state_dir, " holds part of a CA (ca.crt or ca.key without the rest); move it away or complete it"));
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) fail(kWhere, cat("cannot create ", state_dir, ": ", ec.message()));
  fs::permissions(state_dir, fs::perms::owner_all, ec);

  Random rng;
  Pk ca = generate_key(rng);
  const std::string ca_pem = make_cert({kCaSubject, true, {}, 20}, ca.get(), ca.get(), kCaSubject, rng);
  Pk server = generate_key(rng);
  const std::string server_pem = make_cert({"CN=tandem-cloud,O=tandem", false, hosts, 10}, server.get(), ca.get(),
                                           kCaSubject, rng);
  write_atomically(ca_key, key_pem(ca.get()), 0600);
  write_atomically(r.server_key, key_pem(server.get()), 0600);
  write_atomically(r.server_cert, server_pem, 0644);
  write_atomically(r.ca_cert, ca_pem, 0644);  // last: its presence means the rest is there
  r.created = true;
  return r;
}

void require_ca(const std::string& state_dir) {
  if (!fs::exists(state_dir + "/ca.crt") || !fs::exists(state_dir + "/ca.key"))
    fail(kWhere, cat(state_dir, " has no CA; run `tandem-cloud pki init --state-dir ", state_dir, "` first"));
}

void issue(const std::string& state_dir, const std::string& client_name, const std::string& out_dir,
           const std::vector<std::string>& hosts) {
  check_client_name(client_name);
  require_ca(state_dir);
  const std::string ca_cert = state_dir + "/ca.crt", ca_key_path = state_dir + "/ca.key";
  Random rng;
  Pk ca_key = load_key(ca_key_path);
  Crt ca = load_crt(ca_cert);
  char issuer[256];
  if (mbedtls_x509_dn_gets(issuer, sizeof issuer, &ca->subject) < 0) fail(kWhere, "cannot read the CA's subject");
  Pk key = generate_key(rng);
  const CertSpec spec{cat("CN=", client_name, ",O=tandem edge"), false, hosts, 2};
  std::string serial;
  const std::string pem = make_cert(spec, key.get(), ca_key.get(), issuer, rng, &serial);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail(kWhere, cat("cannot create ", out_dir, ": ", ec.message()));
  write_atomically(out_dir + "/client.key", key_pem(key.get()), 0600);
  write_atomically(out_dir + "/client.crt", pem, 0644);
  fs::copy_file(ca_cert, out_dir + "/ca.crt", fs::copy_options::overwrite_existing, ec);
  if (ec) fail(kWhere, cat("cannot copy the CA certificate to ", out_dir, ": ", ec.message()));
  // In the register once the identity is complete: `pki revoke` finds its serial there.
  record_issued(state_dir, {client_name, serial, static_cast<int64_t>(spec.now), static_cast<int64_t>(spec.not_after())});
}

std::string verify(const std::string& ca_path, const std::string& cert_path) {
  Crt ca = load_crt(ca_path);
  Crt cert = load_crt(cert_path);
  uint32_t flags = 0;
  const int rc = mbedtls_x509_crt_verify(cert.get(), ca.get(), nullptr, nullptr, &flags, nullptr, nullptr);
  if (rc == 0) return "";
  char info[512];
  mbedtls_x509_crt_verify_info(info, sizeof info, "", flags);
  std::string text = info;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.empty() ? mbed_error(rc) : text;
}

}  // namespace tandem::pki
