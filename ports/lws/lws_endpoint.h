// The cloud's TLS WebSocket server on libwebsockets (the edge's client is ports/tls). One
// service thread owns the lws context; other threads exchange whole messages with it through
// bounded queues and wake it with lws_cancel_service(). TLS is always on; a client certificate
// signed by the CA is required unless the application is told to authenticate the peer itself.
// Messages go out in 64 KiB fragments from the WRITEABLE callback; arriving fragments are
// collected up to a size cap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/wire/frame.h"
#include "ports/tls/endpoint_event.h"

struct lws;
struct lws_context;
struct lws_retry_bo;
struct lws_http_mount;

namespace tandem {

class LwsEndpoint {
 public:
  // A server listening on host:port (port 0: any free port, see port()).
  static std::unique_ptr<LwsEndpoint> listen(const std::string& host, int port, const TlsIdentity& tls,
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
  // Queues a message (copied) for `connection`; with
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
  void start(const std::string& host, int port, const TlsIdentity& tls);
  void push_event(EndpointEvent event);
  Connection* connection_of(lws* wsi);
  int write_some(lws* wsi, Connection& c);
  void queue(Connection& c, Outgoing m);  // service thread
  void service_loop();

  EndpointOptions options_;
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
  std::vector<unsigned char> write_buffer_;
  std::vector<lws*> paused_;
  std::atomic<uint64_t> refused_connections_{0}, overflowed_connections_{0};
};

}  // namespace tandem
