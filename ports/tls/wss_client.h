// The edge's TLS WebSocket client, on OpenSSL: one service thread owns the socket, decrypts
// arriving records straight into the message being collected (about a memcpy a byte), and
// writes masked frames when the socket takes them. Same events and bounds as LwsEndpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ports/tls/endpoint_event.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace tandem {

// Why ours and not libwebsockets' client: Debian's lws 4.1 hands a client's payload to the
// application after a per-byte state machine, about 6 ns a received byte against a memcpy's
// 0.1; on the edge that was a fifth of the process's time (bench/README.md, split_vs_pytorch).
// lws cannot start TLS on a raw client socket either, so its raw path is no way around it.
class WssClient {
 public:
  // Connects (asynchronously: wait for Connected or Closed) to wss://host:port/ with the
  // tandem.v1 protocol. The server's certificate must chain to tls.ca and name `host`;
  // tls.cert and tls.key are presented unless tls.cert is empty. Throws Error when a file
  // cannot be read or the key does not match the certificate.
  static std::unique_ptr<WssClient> connect(const std::string& host, int port, const TlsIdentity& tls,
                                            const EndpointOptions& options = {});
  ~WssClient();
  WssClient(const WssClient&) = delete;
  WssClient& operator=(const WssClient&) = delete;

  // Waits up to `timeout` for the next event: Connected (text: the server certificate's CN),
  // Message, then one Closed (text: why).
  bool next(EndpointEvent& event, std::chrono::milliseconds timeout);
  // Queues a message (copied); with close_after the connection closes once it is sent, and
  // later messages are dropped. `connection` is ignored (there is one).
  void send(uint64_t connection, std::span<const uint8_t> bytes, bool close_after = false);
  std::size_t queued_events();

 private:
  struct Outgoing {
    std::vector<uint8_t> bytes;
    bool close_after;
  };
  WssClient() = default;
  void run();
  bool open(std::string& why);  // TCP, TLS, the WebSocket upgrade
  bool serve(std::string& why);  // frames both ways until either side closes
  bool wait_socket(bool for_write, std::chrono::steady_clock::time_point deadline);
  bool stopping();
  bool read_some(std::string& why);
  bool take_frames(std::string& why);  // parses in_[in_begin_, in_end_)
  bool payload_done(std::string& why);
  void reserve_rx(std::size_t more);
  bool write_some(std::string& why);
  void queue_control(uint8_t opcode, const uint8_t* payload, std::size_t n);
  void push_event(EndpointEvent event);
  void wake();
  uint32_t mask_key();

  std::string host_;
  int port_ = 0;
  EndpointOptions options_;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1, wake_fd_ = -1;
  std::thread thread_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<EndpointEvent> events_;
  std::deque<Outgoing> outbox_;  // from other threads
  bool stopping_ = false;
  std::atomic<bool> paused_{false};  // reading stopped: the application lags

  // Service-thread only. Arriving: raw plaintext in in_, or straight into rx_ (the message).
  std::vector<uint8_t> in_;
  std::size_t in_begin_ = 0, in_end_ = 0;
  bool in_payload_ = false, in_message_ = false, control_ = false;
  uint8_t opcode_ = 0;
  bool fin_ = false;
  uint64_t payload_left_ = 0;
  std::unique_ptr<uint8_t[]> rx_;
  std::size_t rx_size_ = 0, rx_capacity_ = 0;
  std::vector<uint8_t> control_payload_;
  // Leaving: whole messages, the frame being written, control frames first.
  std::deque<Outgoing> out_;
  std::size_t out_sent_ = 0;  // bytes of out_.front() framed so far
  std::deque<std::vector<uint8_t>> controls_;
  std::vector<uint8_t> frame_;  // the frame being written: [0, frame_len_), frame_sent_ of it out
  std::size_t frame_len_ = 0, frame_sent_ = 0;
  bool want_write_ = false, write_wants_read_ = false;
  bool close_queued_ = false;  // a message with close_after is queued: later ones are dropped
  bool closing_ = false;       // our close frame is queued: nothing more goes out
  bool peer_closed_ = false;   // the server's close frame arrived
  std::string peer_reason_;
  std::chrono::steady_clock::time_point last_heard_, ping_sent_, close_sent_;
  bool ping_out_ = false;
};

}  // namespace tandem
