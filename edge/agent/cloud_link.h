// The edge's connection to the cloud as the agent uses it: connect with the identity folder,
// send a message, wait for the next one (a close or a silence becomes an Error naming what
// was awaited), and count bytes each way and the time spent waiting.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/wire/frame.h"
#include "ports/tls/wss_client.h"

namespace tandem {

// Throws an Error that says what to do when IDDIR is not a complete identity folder
// (client.crt, client.key and ca.crt; ca.crt alone for an edge with an enrolment token).
// train_over_wss calls it before anything else; CloudLink expects a checked folder.
void check_identity_folder(const std::string& identity_dir, bool without_certificate);

class CloudLink {
 public:
  // Connects to wss://host:port with IDDIR/client.crt, client.key and ca.crt; throws Error
  // saying what to check when the cloud does not answer or refuses the identity.
  // `without_certificate`: only IDDIR/ca.crt is used (the edge authenticates with a token).
  CloudLink(const std::string& host, int port, const std::string& identity_dir, bool without_certificate = false);

  void send(std::span<const uint8_t> bytes);
  Frame await(const char* awaiting);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  uint64_t bytes_up() const { return up_; }
  uint64_t bytes_down() const { return down_; }
  double idle_seconds() const { return idle_s_; }

 private:
  std::unique_ptr<WssClient> link_;
  std::string host_;
  int port_ = 0;
  uint64_t up_ = 0, down_ = 0;
  double idle_s_ = 0.0;
};

}  // namespace tandem
