#include "ports/tls/wss_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>

#include "core/error.h"
#include "ports/tls/ws_frame.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kProtocol = "tandem.v1";
constexpr std::size_t kFragment = 64 * 1024;     // a leaving message's frames
constexpr std::size_t kReadChunk = 256 * 1024;   // plaintext read at once outside payloads
constexpr std::size_t kMaxUpgradeReply = 16 * 1024;
constexpr auto kCloseWait = std::chrono::seconds(1);  // for the server's close after ours
constexpr uint64_t kConnection = 1;

std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (!e) return "";
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

std::string base64(const uint8_t* data, std::size_t n) {
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  const int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(static_cast<std::size_t>(len));
  return out;
}

// RFC 6455 section 4.2.2: the server proves it read the key.
std::string accept_of(const std::string& key) {
  const std::string s = key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  uint8_t digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(s.data()), s.size(), digest);
  return base64(digest, sizeof digest);
}

// The value of header `name` (lowercase) in an HTTP reply, "" without it.
std::string header_value(const std::string& reply, const std::string& name) {
  std::size_t at = reply.find("\r\n");
  while (at != std::string::npos && at + 2 < reply.size()) {
    const std::size_t end = reply.find("\r\n", at + 2);
    const std::string line = reply.substr(at + 2, end == std::string::npos ? std::string::npos : end - at - 2);
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string key = line.substr(0, colon);
      std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
      if (key == name) {
        const std::size_t first = line.find_first_not_of(" \t", colon + 1);
        const std::size_t last = line.find_last_not_of(" \t");
        return first == std::string::npos ? "" : line.substr(first, last - first + 1);
      }
    }
    at = end;
  }
  return "";
}

std::string common_name(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (!cert) return "";
  char cn[256] = {};
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  X509_free(cert);
  return n > 0 ? std::string(cn, static_cast<std::size_t>(n)) : "";
}

}  // namespace

std::unique_ptr<WssClient> WssClient::connect(const std::string& host, int port, const TlsIdentity& tls,
                                              const EndpointOptions& options) {
  std::unique_ptr<WssClient> c(new WssClient);
  c->host_ = host;
  c->port_ = port;
  c->options_ = options;
  c->ctx_ = SSL_CTX_new(TLS_client_method());
  if (!c->ctx_) fail("transport", cat("cannot create a TLS client context: ", openssl_error()));
  SSL_CTX_set_min_proto_version(c->ctx_, TLS1_2_VERSION);
  SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(c->ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  static const unsigned char kAlpn[] = "\x08http/1.1";
  SSL_CTX_set_alpn_protos(c->ctx_, kAlpn, sizeof kAlpn - 1);
  if (SSL_CTX_load_verify_locations(c->ctx_, tls.ca.c_str(), nullptr) != 1)
    fail("transport", cat("cannot create a TLS client context with CA ", tls.ca, ": ", openssl_error()));
  if (!tls.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(c->ctx_, tls.cert.c_str()) != 1)
      fail("transport", cat("cannot read the client certificate ", tls.cert, ": ", openssl_error()));
    if (SSL_CTX_use_PrivateKey_file(c->ctx_, tls.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(c->ctx_) != 1)
      fail("transport", cat("cannot use the client key ", tls.key, " with ", tls.cert, ": ", openssl_error()));
  }
  c->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->wake_fd_ < 0) fail("transport", cat("eventfd: ", std::strerror(errno)));
  c->in_.resize(kReadChunk);
  c->frame_.resize(kMaxClientFrameHeader + kFragment);
  c->thread_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

WssClient::~WssClient() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  if (ssl_) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (ctx_) SSL_CTX_free(ctx_);
}

void WssClient::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void WssClient::push_event(EndpointEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
    if (events_.size() >= options_.queue_depth) paused_ = true;  // the application lags: stop reading
  }
  arrived_.notify_one();
}

bool WssClient::next(EndpointEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!arrived_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  event = std::move(events_.front());
  events_.pop_front();
  if (paused_ && events_.size() < options_.queue_depth / 2) {
    paused_ = false;
    lock.unlock();
    wake();
  }
  return true;
}

void WssClient::send(uint64_t, std::span<const uint8_t> bytes, bool close_after) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outbox_.push_back({std::vector<uint8_t>(bytes.begin(), bytes.end()), close_after});
  }
  wake();
}

std::size_t WssClient::queued_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

uint32_t WssClient::mask_key() {
  uint32_t key = 0;
  RAND_bytes(reinterpret_cast<unsigned char*>(&key), sizeof key);
  return key;
}

void WssClient::run() {
  // A write to a socket the server closed raises SIGPIPE in the writing thread: this one
  // takes it as EPIPE instead, leaving the process's signal handling alone.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);

  std::string why;
  if (!open(why)) {
    push_event({EndpointEvent::Kind::Closed, 0, {}, why, {}});
    return;
  }
  push_event({EndpointEvent::Kind::Connected, kConnection, {}, common_name(ssl_), {}});
  serve(why);
  push_event({EndpointEvent::Kind::Closed, kConnection, {}, why, {}});
}

bool WssClient::wait_socket(bool for_write, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return false;
  pollfd p[2] = {{fd_, static_cast<short>(for_write ? POLLOUT : POLLIN), 0}, {wake_fd_, POLLIN, 0}};
  ::poll(p, 2, static_cast<int>(std::min<long long>(left, 200)));
  if (p[1].revents & POLLIN) {  // a send() or the destructor: the outbox waits for serve()
    uint64_t count;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
  }
  return !stopping();
}

bool WssClient::stopping() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

bool WssClient::open(std::string& why) {
  const auto deadline = Clock::now() + std::chrono::seconds(std::max(1, options_.handshake_timeout_s));
  const std::string where = cat("wss://", host_, ":", port_);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int e = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found); e != 0) {
    why = cat("connection failed: cannot resolve ", host_, ": ", gai_strerror(e));
    return false;
  }
  why = cat("connection failed: nothing answers at ", where);
  for (addrinfo* a = found; a && fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = cat("connection failed: ", where, ": ", std::strerror(errno));
      ::close(fd);
      continue;
    }
    fd_ = fd;
    bool ready = false;
    while (!ready && Clock::now() < deadline && !stopping()) {
      pollfd p = {fd_, POLLOUT, 0};
      ready = ::poll(&p, 1, 200) > 0;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (!ready || err != 0) {
      why = cat("connection failed: ", where, ": ", err ? std::strerror(err) : "no answer in time");
      ::close(fd_);
      fd_ = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) return false;
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  ssl_ = SSL_new(ctx_);
  SSL_set_fd(ssl_, fd_);
  unsigned char ip[16];
  if (::inet_pton(AF_INET, host_.c_str(), ip) == 1 || ::inet_pton(AF_INET6, host_.c_str(), ip) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), host_.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl_, host_.c_str());
    SSL_set1_host(ssl_, host_.c_str());
  }
  for (;;) {
    const int r = SSL_connect(ssl_);
    if (r == 1) break;
    const int e = SSL_get_error(ssl_, r);
    if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) || !wait_socket(e == SSL_ERROR_WANT_WRITE, deadline)) {
      const long verify = SSL_get_verify_result(ssl_);
      const std::string detail = openssl_error();
      why = verify != X509_V_OK ? cat("connection failed: the server's certificate: ", X509_verify_cert_error_string(verify))
            : cat("connection failed: TLS handshake with ", where, ": ", detail.empty() ? "no answer in time" : detail);
      return false;
    }
  }

  uint8_t nonce[16];
  RAND_bytes(nonce, sizeof nonce);
  const std::string key = base64(nonce, sizeof nonce);
  const std::string request = cat("GET / HTTP/1.1\r\nHost: ", host_, ":", port_,
                                  "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ", key,
                                  "\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: ", kProtocol, "\r\n\r\n");
  for (std::size_t sent = 0; sent < request.size();) {
    const int r = SSL_write(ssl_, request.data() + sent, static_cast<int>(request.size() - sent));
    if (r > 0) {
      sent += static_cast<std::size_t>(r);
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) || !wait_socket(e == SSL_ERROR_WANT_WRITE, deadline)) {
      why = cat("connection closed during the handshake: ", openssl_error());
      return false;
    }
  }
  std::string reply;
  for (;;) {
    const int r = SSL_read(ssl_, in_.data(), static_cast<int>(in_.size()));
    if (r > 0) {
      reply.append(reinterpret_cast<const char*>(in_.data()), static_cast<std::size_t>(r));
      const std::size_t end = reply.find("\r\n\r\n");
      if (end != std::string::npos) {
        // What follows the reply is already frames.
        in_end_ = reply.size() - (end + 4);
        std::memcpy(in_.data(), reply.data() + end + 4, in_end_);
        reply.resize(end + 2);
        break;
      }
      if (reply.size() > kMaxUpgradeReply) {
        why = "connection closed during the handshake: the server's reply to the upgrade is too long";
        return false;
      }
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) || !wait_socket(e == SSL_ERROR_WANT_WRITE, deadline)) {
      // A server that refuses this client's certificate says so here (TLS 1.3 checks it
      // after the client's handshake is done).
      const std::string detail = openssl_error();
      why = cat("connection closed during the handshake", detail.empty() ? "" : ": ", detail);
      return false;
    }
  }
  if (reply.compare(0, 12, "HTTP/1.1 101") != 0) {
    why = cat("connection closed during the handshake: the server answered the upgrade with \"",
              reply.substr(0, reply.find("\r\n")), "\"");
    return false;
  }
  if (header_value(reply, "sec-websocket-accept") != accept_of(key)) {
    why = "connection closed during the handshake: the server's Sec-WebSocket-Accept does not match the key";
    return false;
  }
  if (header_value(reply, "sec-websocket-protocol") != kProtocol) {
    why = cat("connection closed during the handshake: the server did not agree to the ", kProtocol, " protocol");
    return false;
  }
  last_heard_ = Clock::now();
  return true;
}

bool WssClient::serve(std::string& why) {
  // Frames that came with the upgrade's reply.
  if (in_end_ > 0 && !take_frames(why)) return false;
  for (;;) {
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
      for (Outgoing& m : outbox_) {
        if (closing_ || close_queued_) continue;  // after the last message, nothing goes out
        close_queued_ = m.close_after;
        out_.push_back(std::move(m));
      }
      outbox_.clear();
    }
    if (stopping) {
      // Going away: a close frame if the socket takes it now, and no waiting for the reply.
      if (!closing_) {
        const uint8_t going_away[2] = {0x03, 0xE9};  // 1001
        queue_control(ws_opcode::kClose, going_away, 2);
        closing_ = true;
        close_sent_ = Clock::now();
      }
      write_some(why);
      why = "connection closed by this side";
      return true;
    }
    if (!write_some(why)) return false;
    if (!paused_ && !read_some(why)) return false;
    const auto now = Clock::now();
    if (peer_closed_) {
      // Our answer to the server's close goes out, then the connection ends.
      if (frame_len_ == 0 && controls_.empty()) {
        why = peer_reason_.empty() ? "connection closed" : cat("connection closed: ", peer_reason_);
        return true;
      }
    } else if (closing_ && frame_len_ == 0 && controls_.empty() && now - close_sent_ > kCloseWait) {
      why = "connection closed";
      return true;
    }
    if (now - last_heard_ > std::chrono::seconds(options_.idle_hangup_s)) {
      why = cat("connection closed: nothing from the server for ", options_.idle_hangup_s, " s");
      return false;
    }
    if (!ping_out_ && !closing_ && now - last_heard_ > std::chrono::seconds(options_.idle_ping_s)) {
      queue_control(ws_opcode::kPing, nullptr, 0);
      ping_out_ = true;
      continue;
    }
    const bool has_output = frame_len_ > 0 || !controls_.empty() || !out_.empty();
    pollfd p[2] = {{fd_, 0, 0}, {wake_fd_, POLLIN, 0}};
    if (!paused_ || write_wants_read_) p[0].events |= POLLIN;
    if ((has_output && !write_wants_read_) || want_write_) p[0].events |= POLLOUT;
    if (::poll(p, 2, 250) < 0 && errno != EINTR) {
      why = cat("connection failed: poll: ", std::strerror(errno));
      return false;
    }
    if (p[1].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
    }
  }
}

bool WssClient::read_some(std::string& why) {
  for (;;) {
    uint8_t* dst;
    std::size_t room;
    const bool direct = in_payload_ && !control_ && in_begin_ == in_end_;
    if (direct) {
      // The payload goes straight where the message is collected: no copy of it here.
      const std::size_t want = static_cast<std::size_t>(std::min<uint64_t>(payload_left_, 1u << 30));
      reserve_rx(want);
      dst = rx_.get() + rx_size_;
      room = want;
    } else {
      if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
      if (in_end_ == in_.size()) {  // a partial header at the end: move it to the front
        std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
        in_end_ -= in_begin_;
        in_begin_ = 0;
      }
      dst = in_.data() + in_end_;
      room = in_.size() - in_end_;
    }
    const int r = SSL_read(ssl_, dst, static_cast<int>(std::min<std::size_t>(room, 1u << 30)));
    if (r > 0) {
      last_heard_ = Clock::now();
      ping_out_ = false;
      if (direct) {
        rx_size_ += static_cast<std::size_t>(r);
        payload_left_ -= static_cast<uint64_t>(r);
        if (payload_left_ == 0 && !payload_done(why)) return false;
      } else {
        in_end_ += static_cast<std::size_t>(r);
        if (!take_frames(why)) return false;
      }
      if (paused_ || peer_closed_) return true;
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) return true;
    if (e == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return true;
    }
    const std::string detail = openssl_error();
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && detail.empty()))
      why = peer_closed_ ? "connection closed" : "connection closed by the server without a close frame";
    else
      why = cat("connection failed: ", detail.empty() ? std::strerror(errno) : detail);
    return false;
  }
}

void WssClient::reserve_rx(std::size_t more) {
  if (rx_size_ + more <= rx_capacity_) return;
  // Kept from message to message: after the first few, collecting one allocates nothing.
  const std::size_t capacity = std::max({rx_size_ + more, 2 * rx_capacity_, std::size_t{64 * 1024}});
  std::unique_ptr<uint8_t[]> grown(new uint8_t[capacity]);
  if (rx_size_) std::memcpy(grown.get(), rx_.get(), rx_size_);
  rx_ = std::move(grown);
  rx_capacity_ = capacity;
}

bool WssClient::take_frames(std::string& why) {
  while (in_begin_ < in_end_ || (in_payload_ && payload_left_ == 0)) {
    if (!in_payload_) {
      ServerFrameHeader h;
      std::string broken;
      if (!read_server_frame_header(in_.data() + in_begin_, in_end_ - in_begin_, h, broken)) {
        if (broken.empty()) return true;  // more bytes needed
        why = cat("connection closed: the server broke the WebSocket protocol: ", broken);
        const uint8_t protocol_error[2] = {0x03, 0xEA};  // 1002
        queue_control(ws_opcode::kClose, protocol_error, 2);
        return false;
      }
      in_begin_ += h.size;
      control_ = h.opcode >= ws_opcode::kClose;
      if (!control_) {
        if (h.opcode == ws_opcode::kText) {
          why = "connection closed: the server sent a text frame (tandem.v1 is binary frames only)";
          return false;
        }
        if ((h.opcode == ws_opcode::kContinuation) != in_message_) {
          why = in_message_ ? "connection closed: the server began a message inside another"
                            : "connection closed: the server continued a message it never began";
          return false;
        }
        if (rx_size_ + h.length > options_.max_message_bytes) {
          why = cat("connection closed: a message from the server exceeds the limit of ", options_.max_message_bytes,
                    " bytes");
          const uint8_t too_big[2] = {0x03, 0xF1};  // 1009
          queue_control(ws_opcode::kClose, too_big, 2);
          return false;
        }
        in_message_ = true;
      }
      control_payload_.clear();
      opcode_ = h.opcode;
      fin_ = h.fin;
      payload_left_ = h.length;
      in_payload_ = true;
    }
    const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(payload_left_, in_end_ - in_begin_));
    if (control_) {
      control_payload_.insert(control_payload_.end(), in_.begin() + static_cast<std::ptrdiff_t>(in_begin_),
                              in_.begin() + static_cast<std::ptrdiff_t>(in_begin_ + n));
    } else if (n > 0) {
      reserve_rx(static_cast<std::size_t>(payload_left_));
      std::memcpy(rx_.get() + rx_size_, in_.data() + in_begin_, n);
      rx_size_ += n;
    }
    in_begin_ += n;
    payload_left_ -= n;
    if (payload_left_ > 0) return true;  // the rest is still on its way
    if (!payload_done(why)) return false;
    if (peer_closed_) return true;
  }
  return true;
}

bool WssClient::payload_done(std::string& why) {
  in_payload_ = false;
  if (!control_) {
    if (!fin_) return true;
    push_event({EndpointEvent::Kind::Message, kConnection, Frame::copy_of(rx_.get(), rx_size_), {}, {}});
    rx_size_ = 0;
    in_message_ = false;
    return true;
  }
  switch (opcode_) {
    case ws_opcode::kPing:
      queue_control(ws_opcode::kPong, control_payload_.data(), control_payload_.size());
      return true;
    case ws_opcode::kPong:
      return true;
    default: {  // close: answered with its code, then the connection ends
      peer_closed_ = true;
      if (control_payload_.size() > 2)
        peer_reason_.assign(control_payload_.begin() + 2, control_payload_.end());
      if (!closing_) {
        queue_control(ws_opcode::kClose, control_payload_.data(), std::min<std::size_t>(control_payload_.size(), 2));
        closing_ = true;
      }
      out_.clear();  // what the server will not read
      out_sent_ = 0;
      (void)why;
      return true;
    }
  }
}

void WssClient::queue_control(uint8_t opcode, const uint8_t* payload, std::size_t n) {
  std::vector<uint8_t> frame(kMaxClientFrameHeader + 125);
  frame.resize(write_client_control_frame(frame.data(), opcode, payload, n, mask_key()));
  controls_.push_back(std::move(frame));
}

bool WssClient::write_some(std::string& why) {
  want_write_ = write_wants_read_ = false;
  for (;;) {
    if (frame_len_ == 0) {
      // The next frame: control frames first (they may go between a message's fragments).
      if (!controls_.empty()) {
        std::memcpy(frame_.data(), controls_.front().data(), controls_.front().size());
        frame_len_ = controls_.front().size();
        controls_.pop_front();
      } else if (!out_.empty()) {
        Outgoing& m = out_.front();
        const std::size_t chunk = std::min(kFragment, m.bytes.size() - out_sent_);
        const bool first = out_sent_ == 0, last = out_sent_ + chunk == m.bytes.size();
        frame_len_ = write_client_frame(frame_.data(), m.bytes.data() + out_sent_, chunk, first, last, mask_key());
        out_sent_ += chunk;
        if (last) {
          const bool close_after = m.close_after;
          out_.pop_front();
          out_sent_ = 0;
          if (close_after) {
            const uint8_t normal[2] = {0x03, 0xE8};  // 1000
            queue_control(ws_opcode::kClose, normal, 2);
            closing_ = true;
            close_sent_ = Clock::now();
          }
        }
      } else {
        return true;
      }
      frame_sent_ = 0;
    }
    const int r = SSL_write(ssl_, frame_.data() + frame_sent_, static_cast<int>(frame_len_ - frame_sent_));
    if (r > 0) {
      frame_sent_ += static_cast<std::size_t>(r);
      if (frame_sent_ == frame_len_) frame_len_ = frame_sent_ = 0;
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return true;
    }
    if (e == SSL_ERROR_WANT_READ) {
      write_wants_read_ = true;
      return true;
    }
    const std::string detail = openssl_error();
    why = cat("connection failed while sending: ", detail.empty() ? std::strerror(errno) : detail);
    return false;
  }
}

}  // namespace tandem
