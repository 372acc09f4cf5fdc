// TLS WebSocket endpoints on libwebsockets (server for the cloud, client for the edge). One
// service thread owns the lws context; other threads exchange whole messages with it through
// bounded queues and wake it with lws_cancel_service(). TLS is always on; the server requires
// a client certificate signed by its CA unless told to leave that to the application. Messages go out in 64 KiB fragments from the
// WRITEABLE callback; arriving fragments are collected up to a size cap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/wire/frame.h"

struct lws;
struct lws_context;
struct lws_retry_bo;
struct lws_http_mount;

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
};

struct EndpointEvent {
  enum class Kind { Connected, Message, Closed } kind = Kind::Closed;
  uint64_t connection = 0;
  Frame frame;       // Message
  std::string text;  // Connected: the peer certificate's CN; Closed: why, when known
  std::string serial;  // Connected (server): the peer certificate's serial, lowercase hex; "" without one
};

class LwsEndpoint {
 public:
  // A server listening on host:port (port 0: any free port, see port()).
  static std::unique_ptr<LwsEndpoint> listen(const std::string& host, int port, const TlsIdentity& tls,
                                             const EndpointOptions& options = {});
  // A client connected (asynchronously: wait for Connected or Closed) to wss://host:port/.
  // `tls.cert` may be empty to connect without a client certificate.
  static std::unique_ptr<LwsEndpoint> connect(const std::string& host, int port, const TlsIdentity& tls,
                                              const EndpointOptions& options = {});
  ~LwsEndpoint();
  LwsEndpoint(const LwsEndpoint&) = delete;
  LwsEndpoint& operator=(const LwsEndpoint&) = delete;

  int port() const { return port_; }
  // Connections refused for max_connections, and closed for max_queued_bytes, so far.
  uint64_t refused_connections() const { return refused_connections_.load(); }
  uint64_t overflowed_connections() const { return overflowed_connections_.load(); }
  // Messages arrived and not yet taken with next().
  std::size_t queued_events();
  // Waits up to `timeout` for the next event.
  bool next(EndpointEvent& event, std::chrono::milliseconds timeout);
  // Queues a message (copied) for `connection` (clients: 0 or the Connected id); with
  // close_after the connection closes once it is sent, and later messages to it are dropped.
  void send(uint64_t connection, std::span<const uint8_t> bytes, bool close_after = false);

  // The lws callback, for the C trampoline only.
  int on_callback(lws* wsi, int reason, void* in, std::size_t len);

 private:
  struct Connection;
  struct Outgoing {
    uint64_t connection;
    std::vector<uint8_t> bytes;
    bool close_after;
  };
  LwsEndpoint() = default;
  void start(bool server, const std::string& host, int port, const TlsIdentity& tls);
  void push_event(EndpointEvent event);
  Connection* connection_of(lws* wsi);
  int write_some(lws* wsi, Connection& c);
  void queue(Connection& c, Outgoing m);  // service thread
  void service_loop();

  EndpointOptions options_;
  bool server_ = false;
  int port_ = 0;
  lws_context* context_ = nullptr;
  std::unique_ptr<lws_retry_bo> retry_;  // must outlive the context
  std::unique_ptr<lws_http_mount> mount_;  // the web root's, likewise
  std::thread thread_;
  bool stopping_ = false;  // guarded by mutex_

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<EndpointEvent> events_;
  std::deque<Outgoing> outbox_;  // from other threads, moved to connections on wake-up
  bool resume_reading_ = false;

  // Service-thread only.
  std::map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::map<lws*, uint64_t> ids_;
  uint64_t next_id_ = 1;
  bool client_reported_ = false;  // client role: the connection's end was already reported
  std::vector<unsigned char> write_buffer_;
  std::random_device entropy_;  // client frames' mask keys
  std::vector<lws*> paused_;
  std::atomic<uint64_t> refused_connections_{0}, overflowed_connections_{0};
};

}  // namespace tandem
