#include "ports/crypto/certificate_name.h"

#include <cstring>

#include <mbedtls/oid.h>
#include <mbedtls/x509_crt.h>

#include "core/error.h"

namespace tandem {

std::string certificate_common_name(const std::string& pem_path) {
  mbedtls_x509_crt crt;
  mbedtls_x509_crt_init(&crt);
  const int rc = mbedtls_x509_crt_parse_file(&crt, pem_path.c_str());
  std::string cn;
  if (rc == 0)
    for (const mbedtls_x509_name* n = &crt.subject; n != nullptr; n = n->next)
      if (MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &n->oid) == 0)
        cn.assign(reinterpret_cast<const char*>(n->val.p), n->val.len);
  mbedtls_x509_crt_free(&crt);
  if (rc != 0) fail("certificate", cat("cannot read the certificate ", pem_path, " (mbedTLS error ", rc, ")"));
  if (cn.empty()) fail("certificate", cat("the certificate ", pem_path, " has no common name (CN)"));
  return cn;
}

}  // namespace tandem
