#include "ports/lws/lws_endpoint.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <libwebsockets.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bn.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/wire/messages.h"
#include "ports/lws/client_frame_audit.h"

namespace tandem {

struct LwsEndpoint::Connection {
  lws* wsi = nullptr;
  std::vector<uint8_t> rx;
  bool discarding = false;  // the rest of an over-size message is dropped
  std::deque<Outgoing> out;
  std::size_t sent = 0;     // bytes of out.front() already written
  std::size_t queued = 0;   // bytes in `out` not yet written
  bool close_when_done = false;
  bool close_after_discard = false;  // refused an over-size message: close once it has passed
  bool closing = false;     // a last message is queued: nothing more goes out
  bool overflowed = false;  // the peer left too much unread: close now
  bool lingering = false;   // the last word is out: waiting for the peer to close
};

struct LwsEndpoint::Shard {
  LwsEndpoint* owner = nullptr;
  lws_context* context = nullptr;
  std::thread thread;
  // Guarded by the endpoint's mutex_.
  std::deque<Outgoing> outbox;  // from other threads, moved to connections on wake-up
  bool resume_reading = false;
  std::vector<lws*> paused;
  uint64_t accepted = 0;
  std::vector<int> adopt;  // sockets the acceptor handed over, adopted on wake-up
  // The sockets handed to it and not yet gone (whether or not they became WebSockets): the
  // acceptor's measure of its load.
  std::atomic<std::size_t> open{0};
  std::set<lws*> adopted;  // this thread's: the adopted sockets' wsi, until destroyed
  // This shard's service thread only.
  std::map<uint64_t, std::unique_ptr<Connection>> connections;
  std::map<lws*, uint64_t> ids;
  std::vector<unsigned char> write_buffer;
  Connection* connection_of(lws* wsi) {
    auto it = ids.find(wsi);
    return it == ids.end() ? nullptr : connections.at(it->second).get();
  }
};

namespace {

constexpr const char* kProtocol = "tandem.v1";
constexpr std::size_t kFragment = 64 * 1024;
constexpr int kUseDefault = -999;  // on_callback: let lws' default handler answer
constexpr int kLingerS = 1;        // after the last word, how long the server waits for the peer to close

int trampoline(lws* wsi, lws_callback_reasons reason, void* user, void* in, size_t len) {
  lws_context* ctx = wsi ? lws_get_context(wsi) : nullptr;
  auto* shard = ctx ? static_cast<LwsEndpoint::Shard*>(lws_context_user(ctx)) : nullptr;
  const int r = shard ? shard->owner->on_callback(*shard, wsi, static_cast<int>(reason), in, len) : kUseDefault;
  return r == kUseDefault ? lws_callback_http_dummy(wsi, reason, user, in, len) : r;
}

// The browser edge's page fetches its model spec and data as raw bytes (--web).
const lws_protocol_vhost_options kWasmMime = {nullptr, nullptr, ".wasm", "application/wasm"};
const lws_protocol_vhost_options kSpecMime = {&kWasmMime, nullptr, ".tdms", "application/octet-stream"};
const lws_protocol_vhost_options kExtraMimeTypes = {&kSpecMime, nullptr, ".u8", "application/octet-stream"};

const lws_protocols kProtocols[] = {
    {kProtocol, trampoline, 0, kFragment, 0, nullptr, 0},
    {nullptr, nullptr, 0, 0, 0, nullptr, 0},
};

std::string peer_common_name(lws* wsi) {
  char big[sizeof(lws_tls_cert_info_results) + 256];
  auto* info = reinterpret_cast<lws_tls_cert_info_results*>(big);
  if (lws_tls_peer_cert_info(wsi, LWS_TLS_CERT_INFO_COMMON_NAME, info,
                             sizeof big - sizeof(*info) + sizeof(info->ns.name)) != 0)
    return "";
  // OpenSSL reports "CN/O=..." for a subject with more fields: the CN is before the '/'.
  std::string cn(info->ns.name, static_cast<std::size_t>(std::max(0, info->ns.len)));
  cn = cn.c_str();
  return cn.substr(0, cn.find('/'));
}

// The peer certificate's serial number in lowercase hex, "" without one. lws reports no
// serial, so it is read from the connection's OpenSSL object (Debian's lws is built on it).
std::string peer_serial(lws* wsi) {
  SSL* ssl = lws_get_ssl(wsi);
  X509* cert = ssl ? SSL_get1_peer_certificate(ssl) : nullptr;
  if (!cert) return "";
  std::string out;
  if (BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr)) {
    if (char* hex = BN_bn2hex(bn)) {
      for (const char* p = hex; *p; ++p) out += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
      OPENSSL_free(hex);
    }
    BN_free(bn);
  }
  X509_free(cert);
  const std::size_t first = out.find_first_not_of('0');
  return first == std::string::npos ? (out.empty() ? "" : "0") : out.substr(first);
}

}  // namespace

std::unique_ptr<LwsEndpoint> LwsEndpoint::listen(const std::string& host, int port, const TlsIdentity& tls,
                                                 const EndpointOptions& options) {
  std::unique_ptr<LwsEndpoint> e(new LwsEndpoint);
  e->options_ = options;
  e->start(host, port, tls);
  return e;
}

void LwsEndpoint::start(const std::string& host, int port, const TlsIdentity& tls) {
  static std::once_flag quiet;
  std::call_once(quiet, [] { lws_set_log_level(std::getenv("TANDEM_LWS_DEBUG") ? LLL_ERR | LLL_WARN | LLL_NOTICE | LLL_INFO : LLL_ERR, nullptr); });

  retry_ = std::make_unique<lws_retry_bo_t>();
  std::memset(retry_.get(), 0, sizeof(lws_retry_bo_t));
  retry_->secs_since_valid_ping = static_cast<uint16_t>(options_.idle_ping_s);
  retry_->secs_since_valid_hangup = static_cast<uint16_t>(options_.idle_hangup_s);

  lws_context_creation_info info;
  std::memset(&info, 0, sizeof info);
  info.protocols = kProtocols;
  info.retry_and_idle_policy = retry_.get();
  info.timeout_secs = static_cast<unsigned int>(std::max(1, options_.handshake_timeout_s));
  info.timeout_secs_ah_idle = static_cast<unsigned int>(std::max(1, options_.handshake_timeout_s));  // a silent socket
  info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
  info.port = port;
  info.iface = host.c_str();
  info.options |= LWS_SERVER_OPTION_REQUIRE_VALID_OPENSSL_CLIENT_CERT | LWS_SERVER_OPTION_DISABLE_IPV6;
  if (options_.client_certificate_optional) info.options |= LWS_SERVER_OPTION_PEER_CERT_NOT_REQUIRED;
  // HTTP/1.1 only: browsers would otherwise carry the WebSocket inside HTTP/2 (RFC 8441),
  // which drops large messages in this libwebsockets.
  info.alpn = "http/1.1";
  if (!options_.web_root.empty()) {
    mount_ = std::make_unique<lws_http_mount>();
    std::memset(mount_.get(), 0, sizeof(lws_http_mount));
    mount_->mountpoint = "/";
    mount_->mountpoint_len = 1;
    mount_->origin = options_.web_root.c_str();
    mount_->def = "index.html";
    mount_->origin_protocol = LWSMPRO_FILE;
    mount_->extra_mimetypes = &kExtraMimeTypes;
    info.mounts = mount_.get();
  }
  info.ssl_cert_filepath = tls.cert.c_str();
  info.ssl_private_key_filepath = tls.key.c_str();
  info.ssl_ca_filepath = tls.ca.c_str();
  // Several service threads: a context each that listens on nothing but adopts the sockets
  // the acceptor hands it (CONTEXT_PORT_NO_LISTEN_SERVER: TLS set up for serving).
  const int threads = std::max(1, options_.io_threads);
  if (threads > 1) {
    listen_socket(host, port);
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;
  }
  for (int i = 0; i < threads; ++i) {
    auto shard = std::make_unique<Shard>();
    shard->owner = this;
    shard->write_buffer.resize(LWS_PRE + kFragment);
    info.user = shard.get();
    shard->context = lws_create_context(&info);
    if (!shard->context)
      fail("transport", cat("cannot listen on ", host, ":", port, " with certificate ", tls.cert,
                            " (port in use, or unreadable certificate, key or CA)"));
    if (threads == 1) port_ = lws_get_vhost_listen_port(lws_get_vhost_by_name(shard->context, "default"));
    shards_.push_back(std::move(shard));
  }
  // Every context exists before any thread serves: each lws_create_context with
  // DO_SSL_GLOBAL_INIT resets a global of lws' OpenSSL glue that the verify callback reads.
  for (auto& shard : shards_) shard->thread = std::thread([this, s = shard.get()] { service_loop(*s); });
  if (threads > 1) {
    if (pipe2(wake_fd_, O_CLOEXEC) != 0) fail("transport", "cannot make the acceptor's wake-up pipe");
    acceptor_ = std::thread([this] { accept_loop(); });
  }
}

void LwsEndpoint::listen_socket(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // as lws here (LWS_SERVER_OPTION_DISABLE_IPV6)
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  // As lws takes its `iface`: an interface's name (its IPv4 address), else an address or a name.
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  bool resolved = false;
  ifaddrs* ifs = nullptr;
  if (!host.empty() && getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && !resolved; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && host == i->ifa_name) {
        at.sin_addr = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
        resolved = true;
      }
    freeifaddrs(ifs);
  }
  if (!resolved) {
    addrinfo* found = nullptr;
    if (getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &found) != 0 || !found)
      fail("transport", cat("cannot listen on ", host, ":", port,
                            ": not an interface, an IPv4 address or a name that resolves to one"));
    at.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
    freeaddrinfo(found);
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int on = 1;
  const bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
                  bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0 && ::listen(fd, SOMAXCONN) == 0;
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    fail("transport", cat("cannot listen on ", host, ":", port, ": ", why));
  }
  listen_fd_ = fd;
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
}

// Accepts connections and hands each to the service thread with the fewest (the lowest index
// on a tie), until the destructor writes to the wake-up pipe.
void LwsEndpoint::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "tandem: the acceptor stopped (poll: %s): no new connection is taken\n", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // out of descriptors: let some close
      continue;
    }
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);  // as lws sets on the sockets it accepts
    Shard* target = shards_.front().get();
    for (auto& shard : shards_)
      if (shard->open.load() < target->open.load()) target = shard.get();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      target->adopt.push_back(fd);
      ++target->open;  // counted now, so the next socket goes elsewhere before this one is up
    }
    lws_cancel_service(target->context);
  }
}

LwsEndpoint::~LwsEndpoint() {
  if (acceptor_.joinable()) {
    const char byte = 0;
    if (write(wake_fd_[1], &byte, 1) != 1) std::fprintf(stderr, "tandem: cannot wake the acceptor\n");
    acceptor_.join();
  }
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]})
    if (fd >= 0) close(fd);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  for (auto& shard : shards_)
    if (shard->context) lws_cancel_service(shard->context);
  for (auto& shard : shards_)
    if (shard->thread.joinable()) shard->thread.join();
  for (auto& shard : shards_) {
    if (shard->context) lws_context_destroy(shard->context);
    for (int fd : shard->adopt) close(fd);  // handed over but never adopted
  }
}

void LwsEndpoint::service_loop(Shard& shard) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    if (lws_service(shard.context, 0) < 0) {
      // This thread's connections are lost; the acceptor hands it nothing more.
      std::fprintf(stderr, "tandem: a TLS service thread stopped (lws_service failed); its connections are lost\n");
      shard.open = std::numeric_limits<std::size_t>::max() / 2;
      return;
    }
  }
}

std::vector<std::size_t> LwsEndpoint::sockets_per_io_thread() const {
  std::vector<std::size_t> out;
  for (const auto& shard : shards_) out.push_back(shard->open.load());
  return out;
}

std::vector<uint64_t> LwsEndpoint::connections_per_io_thread() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> out;
  for (const auto& shard : shards_) out.push_back(shard->accepted);
  return out;
}

void LwsEndpoint::push_event(EndpointEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
  }
  arrived_.notify_one();
}

bool LwsEndpoint::next(EndpointEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!arrived_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  event = std::move(events_.front());
  events_.pop_front();
  if (events_.size() < options_.queue_depth / 2) {
    std::vector<lws_context*> wake;
    for (auto& shard : shards_)
      if (!shard->paused.empty() && !shard->resume_reading) {
        shard->resume_reading = true;
        wake.push_back(shard->context);
      }
    lock.unlock();
    for (lws_context* c : wake) lws_cancel_service(c);
  }
  return true;
}

void LwsEndpoint::send(uint64_t connection, std::span<const uint8_t> bytes, bool close_after) {
  lws_context* wake = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = route_.find(connection);
    if (it == route_.end()) return;  // closed meanwhile
    it->second->outbox.push_back({connection, std::vector<uint8_t>(bytes.begin(), bytes.end()), close_after});
    wake = it->second->context;
  }
  lws_cancel_service(wake);
}

std::size_t LwsEndpoint::queued_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

int LwsEndpoint::write_some(Shard& shard, lws* wsi, Connection& c) {
  if (c.overflowed) return -1;
  if (c.out.empty()) {
    if (!c.close_when_done) return 0;
    if (c.lingering) return -1;
    // The last word (an Error) is out. Closing now, while the peer may still be sending,
    // makes the kernel reset the connection, which can destroy that Error before the peer
    // reads it: the peer closes once it has read it; until then, for at most kLingerS,
    // what it sends is read and dropped (`closing`).
    c.lingering = true;
    lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, kLingerS);
    return 0;
  }
  Outgoing& m = c.out.front();
  const std::size_t chunk = std::min(kFragment, m.bytes.size() - c.sent);
  const bool first = c.sent == 0, last = c.sent + chunk == m.bytes.size();
  unsigned char* at = shard.write_buffer.data() + LWS_PRE;
  if (chunk) std::memcpy(at, m.bytes.data() + c.sent, chunk);
  const int flags = lws_write_ws_flags(LWS_WRITE_BINARY, first, last);
  if (lws_write(wsi, at, chunk, static_cast<lws_write_protocol>(flags)) < static_cast<int>(chunk)) return -1;
  c.sent += chunk;
  c.queued -= chunk;
  if (last) {
    c.close_when_done = c.close_when_done || m.close_after;
    c.out.pop_front();
    c.sent = 0;
  }
  if (!c.out.empty() || c.close_when_done) lws_callback_on_writable(wsi);
  return 0;
}

void LwsEndpoint::queue(Connection& c, Outgoing m) {
  c.closing = c.closing || m.close_after;
  c.queued += m.bytes.size();
  c.out.push_back(std::move(m));
  if (options_.max_queued_bytes && c.queued > options_.max_queued_bytes && !c.overflowed) {
    // The peer does not read what it is sent: holding more would let one peer take the
    // memory every other session needs.
    c.overflowed = true;
    ++overflowed_connections_;
    std::fprintf(stderr, "connection %llu: %zu bytes queued and unread, over the limit of %zu: closing it\n",
                 static_cast<unsigned long long>(c.out.front().connection), c.queued, options_.max_queued_bytes);
  }
  lws_callback_on_writable(c.wsi);
}

int LwsEndpoint::on_callback(Shard& shard, lws* wsi, int reason, void* in, std::size_t len) {
  switch (reason) {
    case LWS_CALLBACK_OPENSSL_PERFORM_CLIENT_CERT_VERIFICATION:
      // `len` is OpenSSL's pre-verification result: 0 means the chain did not verify
      // against our CA (REQUIRE_VALID_OPENSSL_CLIENT_CERT alone lets self-signed ones in).
      return len == 0 ? 1 : 0;

    case LWS_CALLBACK_ESTABLISHED: {
      const uint64_t id = next_id_++;
      auto c = std::make_unique<Connection>();
      c->wsi = wsi;
      Connection& conn = *c;
      shard.connections[id] = std::move(c);
      shard.ids[wsi] = id;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        route_[id] = &shard;
        ++shard.accepted;
      }
      const std::size_t open = ++open_connections_;
      if (options_.max_connections && open > options_.max_connections) {
        // Over the bound: the peer learns why, and the application never sees it.
        ++refused_connections_;
        MessageWriter writer;
        const auto bytes = writer.error(wire::ErrorCode::Busy,
                                        cat("the cloud serves at most ", options_.max_connections,
                                            " connections at once and has no room now: try again later"));
        queue(conn, {id, std::vector<uint8_t>(bytes.begin(), bytes.end()), true});
        return 0;
      }
      push_event({EndpointEvent::Kind::Connected, id, {}, peer_common_name(wsi), peer_serial(wsi)});
      return 0;
    }

    case LWS_CALLBACK_RECEIVE: {
      Connection* c = shard.connection_of(wsi);
      if (!c) return -1;
      // What lws does not check (client_frame_audit.h): closed with 1002, nothing delivered.
      if (const std::string why = client_frame_violation(lws_get_ssl(wsi)); !why.empty()) {
        std::fprintf(stderr, "connection %llu: closed: %s\n", static_cast<unsigned long long>(shard.ids[wsi]), why.c_str());
        static const char kReason[] = "unmasked frame";
        lws_close_reason(wsi, LWS_CLOSE_STATUS_PROTOCOL_ERR,
                         reinterpret_cast<unsigned char*>(const_cast<char*>(kReason)), sizeof kReason - 1);
        return -1;
      }
      const bool final = lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi);
      if (c->discarding) {
        c->discarding = !final;
        if (final && c->close_after_discard) {
          c->close_when_done = true;
          lws_callback_on_writable(wsi);
        }
        return 0;
      }
      if (c->rx.size() + len > options_.max_message_bytes) {
        // Refuse as the message arrives, without holding it: an Error now, and the close
        // once the rest of the message has been read (closing with unread data would reset
        // the connection and could destroy the Error before the peer reads it).
        c->rx.clear();
        c->rx.shrink_to_fit();
        c->discarding = !final;
        c->close_after_discard = true;
        c->close_when_done = final;
        MessageWriter writer;
        const auto bytes = writer.error(wire::ErrorCode::TooLarge,
                                        cat("message exceeds the limit of ", options_.max_message_bytes, " bytes"));
        queue(*c, {shard.ids[wsi], std::vector<uint8_t>(bytes.begin(), bytes.end()), false});
        c->closing = true;  // the Error must be the last word
        return 0;
      }
      c->rx.insert(c->rx.end(), static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + len);
      if (!final) return 0;
      if (c->closing) {  // refused (too many connections, revoked...): nothing it says counts
        c->rx.clear();
        return 0;
      }
      push_event({EndpointEvent::Kind::Message, shard.ids[wsi], Frame::copy_of(c->rx.data(), c->rx.size()), {}, {}});
      c->rx.clear();
      std::lock_guard<std::mutex> lock(mutex_);
      if (events_.size() >= options_.queue_depth) {  // the consumer lags: stop reading this peer
        lws_rx_flow_control(wsi, 0);
        shard.paused.push_back(wsi);
      }
      return 0;
    }

    case LWS_CALLBACK_SERVER_WRITEABLE: {
      Connection* c = shard.connection_of(wsi);
      return c ? write_some(shard, wsi, *c) : 0;
    }

    case LWS_CALLBACK_CLOSED: {
      auto it = shard.ids.find(wsi);
      if (it == shard.ids.end()) return 0;
      const uint64_t id = it->second;
      shard.ids.erase(it);
      shard.connections.erase(id);
      --open_connections_;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        route_.erase(id);
        std::erase(shard.paused, wsi);
      }
      push_event({EndpointEvent::Kind::Closed, id, {}, "connection closed", {}});
      return 0;
    }

    case LWS_CALLBACK_WSI_DESTROY:
      if (shard.adopted.erase(wsi)) --shard.open;
      return kUseDefault;

    case LWS_CALLBACK_EVENT_WAIT_CANCELLED: {
      std::deque<Outgoing> moved;
      std::vector<lws*> resume;
      std::vector<int> adopt;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        adopt.swap(shard.adopt);
        moved.swap(shard.outbox);
        if (shard.resume_reading) {
          resume.swap(shard.paused);
          shard.resume_reading = false;
        }
      }
      for (int fd : adopt) {
        // The TLS handshake, the HTTP upgrade and all after run here, as for a socket lws
        // accepted itself. On failure lws has closed the socket.
        lws_sock_file_fd_type sock;
        sock.sockfd = fd;
        const auto type = static_cast<lws_adoption_type>(LWS_ADOPT_SOCKET | LWS_ADOPT_HTTP | LWS_ADOPT_ALLOW_SSL);
        if (lws* w = lws_adopt_descriptor_vhost(lws_get_vhost_by_name(shard.context, "default"), type, sock, nullptr,
                                                nullptr))
          shard.adopted.insert(w);
        else
          --shard.open;
      }
      for (lws* w : resume)
        if (shard.ids.count(w)) lws_rx_flow_control(w, 1);
      for (Outgoing& m : moved) {
        auto it = shard.connections.find(m.connection);
        // Closed meanwhile, or closing (the last word was queued).
        if (it == shard.connections.end() || it->second->closing) continue;
        queue(*it->second, std::move(m));
      }
      return 0;
    }

    default:
      return kUseDefault;
  }
}

}  // namespace tandem
