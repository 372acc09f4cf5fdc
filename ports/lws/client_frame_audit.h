// RFC 6455 section 5.1 for the server: every frame a client sends must be masked, and the
// server must close on one that is not. libwebsockets 4.1 reads the mask bit and goes on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

typedef struct ssl_st SSL;

namespace tandem {

// Follows a client's byte stream on one connection (HTTP requests, then after the upgrade the
// WebSocket frames' headers) and remembers the first rule it breaks.
class ClientFrameAudit {
 public:
  void feed(const uint8_t* data, std::size_t size);
  const std::string& violation() const { return violation_; }

 private:
  enum class State { Http, Header, Payload } state_ = State::Http;
  std::string request_;  // the HTTP request being read (headers only; GETs have no body)
  uint8_t header_[14] = {};
  std::size_t header_size_ = 0;
  uint64_t payload_left_ = 0;
  std::string violation_;
};

// The audit of a server-side TLS connection's plaintext; "" while it broke no rule (or is not
// audited). The audit lives on the SSL object (ex_data) and is freed with it.
std::string client_frame_violation(SSL* ssl);

}  // namespace tandem
