// The cloud's TLS WebSocket server on libwebsockets (the edge's client is ports/tls). Its TLS
// runs on EndpointOptions::io_threads service threads, each owning an lws context (Debian's lws
// is built for one service thread a context). With one, lws listens itself; with more, an
// acceptor thread of ours listens and hands each accepted socket to the thread serving the
// fewest connections, which adopts it (TLS handshake, upgrade, everything after). Other threads
// exchange whole messages with them through bounded queues and wake a connection's thread with
// lws_cancel_service(). TLS is always on; a
// client certificate signed by the CA is required unless the application is told to
// authenticate the peer itself. Messages go out in 64 KiB fragments from the WRITEABLE
// callback; arriving fragments are collected up to a size cap.
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

  // The service threads, and how many connections each has taken since the start.
  std::size_t io_threads() const { return shards_.size(); }
  std::vector<uint64_t> connections_per_io_thread() const;
  // With more than one: the sockets each thread serves now (handed over and not yet gone,
  // WebSocket or not), by which the acceptor picks the least loaded.
  std::vector<std::size_t> sockets_per_io_thread() const;

  // One service thread: its lws context and the connections it serves.
  struct Shard;
  // The lws callback, for the C trampoline only.
  int on_callback(Shard& shard, lws* wsi, int reason, void* in, std::size_t len);

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
  int write_some(Shard& shard, lws* wsi, Connection& c);
  void queue(Connection& c, Outgoing m);  // the connection's service thread
  void service_loop(Shard& shard);
  void listen_socket(const std::string& host, int port);  // listen_fd_ and port_, for the acceptor
  void accept_loop();

  EndpointOptions options_;
  int port_ = 0;
  std::unique_ptr<lws_retry_bo> retry_;  // must outlive the contexts
  std::unique_ptr<lws_http_mount> mount_;  // the web root's, likewise
  std::vector<std::unique_ptr<Shard>> shards_;
  int listen_fd_ = -1, wake_fd_[2] = {-1, -1};  // the acceptor's (io_threads > 1)
  std::thread acceptor_;
  bool stopping_ = false;  // guarded by mutex_

  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<EndpointEvent> events_;
  std::map<uint64_t, Shard*> route_;  // open connections' service threads, for send()
  std::atomic<uint64_t> next_id_{1};
  std::atomic<std::size_t> open_connections_{0};
  std::atomic<uint64_t> refused_connections_{0}, overflowed_connections_{0};
};

}  // namespace tandem
