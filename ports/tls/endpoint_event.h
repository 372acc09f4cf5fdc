// What both transports (the lws server and client, the edge's own TLS WebSocket client) take
// and give: a TLS identity, bounds, and the events a service thread hands to the application.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/wire/frame.h"

namespace tandem {

struct TlsIdentity {
  std::string cert, key, ca;  // PEM files
};

struct EndpointOptions {
  std::size_t max_message_bytes = kDefaultMaxMessageBytes;
  std::size_t queue_depth = 64;  // arrived messages not yet taken; reading pauses beyond it
  int idle_ping_s = 20, idle_hangup_s = 60;
  // Server: let peers without a client certificate in (one that presents a certificate must
  // still be signed by the CA); Connected then reports an empty CN and the application must
  // authenticate the peer itself.
  bool client_certificate_optional = false;
  std::string web_root;  // server: serve this folder's files over https at "/" (index.html)
  // Server bounds. At most max_connections WebSocket connections at once (0: no bound); one
  // more is answered with a Busy Error and closed. The TLS handshake and the HTTP upgrade must
  // be done within handshake_timeout_s. A connection with more than max_queued_bytes written
  // to it and not yet sent (a peer that stops reading) is closed (0: no bound).
  std::size_t max_connections = 0;
  int handshake_timeout_s = 10;
  std::size_t max_queued_bytes = 0;
  // Server: the TLS service threads (LwsEndpoint), at least 1.
  int io_threads = 1;
};

struct EndpointEvent {
  enum class Kind { Connected, Message, Closed } kind = Kind::Closed;
  uint64_t connection = 0;
  Frame frame;       // Message
  std::string text;  // Connected: the peer certificate's CN; Closed: why, when known
  std::string serial;  // Connected (server): the peer certificate's serial, lowercase hex; "" without one
};

}  // namespace tandem
