// tandem's PKI on mbedTLS: a CA and a server certificate in the cloud's state folder, and
// edge identities (key, certificate, CA) issued from it, so TLS and mutual TLS need no
// openssl command. Keys are EC P-256, written 0600, files replaced atomically.
#pragma once

#include <string>
#include <vector>

namespace tandem::pki {

struct InitResult {
  bool created = false;  // false: the state folder already held a CA and server certificate
  std::string ca_cert, server_cert, server_key;  // paths
};

// Creates DIR/ca.key, ca.crt, server.key, server.crt (server names: `hosts`, default
// localhost and 127.0.0.1) unless they exist. Throws Error on failure.
InitResult init(const std::string& state_dir, const std::vector<std::string>& hosts = {"localhost", "127.0.0.1"});

// Issues an edge identity: OUT/client.key, OUT/client.crt (CN = client name, signed by the
// CA in DIR) and OUT/ca.crt. Throws Error if DIR has no CA ("run pki init first"). With
// `hosts` the certificate names them too (subjectAltName), so that the party can also serve
// TLS under that identity: a stage of a pipeline, which its upstream party connects to.
void issue(const std::string& state_dir, const std::string& client_name, const std::string& out_dir,
           const std::vector<std::string>& hosts = {});

// Throws Error saying to run `pki init` unless DIR holds a CA (ca.crt and ca.key).
void require_ca(const std::string& state_dir);

// Throws Error unless `name` has 1 to 64 letters, digits, '-', '_' or '.'.
void check_client_name(const std::string& name);

// Checks `cert_path` against the CA in `ca_path`; returns "" when valid, else why not.
std::string verify(const std::string& ca_path, const std::string& cert_path);

// (A certificate's common name: certificate_common_name, ports/crypto, which the edge reads too.)

}  // namespace tandem::pki
