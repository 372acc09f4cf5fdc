#include "ports/lws/lws_endpoint.h"

#include <libwebsockets.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/wire/messages.h"
#include "ports/lws/ws_frame.h"

namespace tandem {
namespace {

constexpr const char* kProtocol = "tandem.v1";
constexpr std::size_t kFragment = 64 * 1024;
constexpr int kUseDefault = -999;  // on_callback: let lws' default handler answer

int trampoline(lws* wsi, lws_callback_reasons reason, void* user, void* in, size_t len) {
  lws_context* ctx = wsi ? lws_get_context(wsi) : nullptr;
  auto* self = ctx ? static_cast<LwsEndpoint*>(lws_context_user(ctx)) : nullptr;
  const int r = self ? self->on_callback(wsi, static_cast<int>(reason), in, len) : kUseDefault;
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

}  // namespace

struct LwsEndpoint::Connection {
  lws* wsi = nullptr;
  std::vector<uint8_t> rx;
  bool discarding = false;  // the rest of an over-size message is dropped
  std::deque<Outgoing> out;
  std::size_t sent = 0;     // bytes of out.front() already written
  bool close_when_done = false;
  bool close_after_discard = false;  // refused an over-size message: close once it has passed
};

std::unique_ptr<LwsEndpoint> LwsEndpoint::listen(const std::string& host, int port, const TlsIdentity& tls,
                                                 const EndpointOptions& options) {
  std::unique_ptr<LwsEndpoint> e(new LwsEndpoint);
  e->options_ = options;
  e->start(true, host, port, tls);
  return e;
}

std::unique_ptr<LwsEndpoint> LwsEndpoint::connect(const std::string& host, int port, const TlsIdentity& tls,
                                                  const EndpointOptions& options) {
  std::unique_ptr<LwsEndpoint> e(new LwsEndpoint);
  e->options_ = options;
  e->start(false, host, port, tls);
  return e;
}

void LwsEndpoint::start(bool server, const std::string& host, int port, const TlsIdentity& tls) {
  server_ = server;
  write_buffer_.resize(LWS_PRE + kMaxClientFrameHeader + kFragment);
  static std::once_flag quiet;
  std::call_once(quiet, [] { lws_set_log_level(std::getenv("TANDEM_LWS_DEBUG") ? LLL_ERR | LLL_WARN | LLL_NOTICE | LLL_INFO : LLL_ERR, nullptr); });

  retry_ = std::make_unique<lws_retry_bo_t>();
  std::memset(retry_.get(), 0, sizeof(lws_retry_bo_t));
  retry_->secs_since_valid_ping = static_cast<uint16_t>(options_.idle_ping_s);
  retry_->secs_since_valid_hangup = static_cast<uint16_t>(options_.idle_hangup_s);

  lws_context_creation_info info;
  std::memset(&info, 0, sizeof info);
  info.protocols = kProtocols;
  info.user = this;
  info.retry_and_idle_policy = retry_.get();
  info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
  if (server) {
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
  } else {
    info.port = CONTEXT_PORT_NO_LISTEN;
    if (!tls.cert.empty()) {
      info.client_ssl_cert_filepath = tls.cert.c_str();
      info.client_ssl_private_key_filepath = tls.key.c_str();
    }
    info.client_ssl_ca_filepath = tls.ca.c_str();
  }
  context_ = lws_create_context(&info);
  if (!context_)
    fail("transport", server ? cat("cannot listen on ", host, ":", port, " with certificate ", tls.cert,
                                   " (port in use, or unreadable certificate, key or CA)")
                             : cat("cannot create a TLS client context with CA ", tls.ca));
  if (server) {
    port_ = lws_get_vhost_listen_port(lws_get_vhost_by_name(context_, "default"));
  } else {
    port_ = port;
    lws_client_connect_info ci;
    std::memset(&ci, 0, sizeof ci);
    ci.context = context_;
    ci.address = host.c_str();
    ci.port = port;
    ci.path = "/";
    ci.host = host.c_str();
    ci.origin = host.c_str();
    ci.protocol = kProtocol;
    ci.ssl_connection = LCCSCF_USE_SSL;
    ci.retry_and_idle_policy = retry_.get();
    if (!lws_client_connect_via_info(&ci))
      push_event({EndpointEvent::Kind::Closed, 0, {}, cat("cannot connect to wss://", host, ":", port)});
  }
  thread_ = std::thread([this] { service_loop(); });
}

LwsEndpoint::~LwsEndpoint() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (context_) lws_cancel_service(context_);
  if (thread_.joinable()) thread_.join();
  if (context_) lws_context_destroy(context_);
}

void LwsEndpoint::service_loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    if (lws_service(context_, 0) < 0) return;
  }
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
  if (!paused_.empty() && events_.size() < options_.queue_depth / 2 && !resume_reading_) {
    resume_reading_ = true;
    lock.unlock();
    lws_cancel_service(context_);
  }
  return true;
}

void LwsEndpoint::send(uint64_t connection, std::span<const uint8_t> bytes, bool close_after) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outbox_.push_back({connection, std::vector<uint8_t>(bytes.begin(), bytes.end()), close_after});
  }
  lws_cancel_service(context_);
}

LwsEndpoint::Connection* LwsEndpoint::connection_of(lws* wsi) {
  auto it = ids_.find(wsi);
  if (it == ids_.end()) return nullptr;
  return connections_.at(it->second).get();
}

int LwsEndpoint::write_some(lws* wsi, Connection& c) {
  if (c.out.empty()) return c.close_when_done ? -1 : 0;
  Outgoing& m = c.out.front();
  const std::size_t chunk = std::min(kFragment, m.bytes.size() - c.sent);
  const bool first = c.sent == 0, last = c.sent + chunk == m.bytes.size();
  unsigned char* at = write_buffer_.data() + LWS_PRE;
  if (server_) {
    if (chunk) std::memcpy(at, m.bytes.data() + c.sent, chunk);
    const int flags = lws_write_ws_flags(LWS_WRITE_BINARY, first, last);
    if (lws_write(wsi, at, chunk, static_cast<lws_write_protocol>(flags)) < static_cast<int>(chunk)) return -1;
  } else {
    // Client frames must be masked; lws 4.1 does that a byte at a time, which cost more than
    // TLS. The frame is built here (masked 8 bytes at a time, a fresh key from the OS's
    // random source each) and goes out raw, still through TLS.
    const std::size_t frame = write_client_frame(at, m.bytes.data() + c.sent, chunk, first, last, entropy_());
    if (lws_write(wsi, at, frame, LWS_WRITE_RAW) < static_cast<int>(frame)) return -1;
  }
  c.sent += chunk;
  if (last) {
    c.close_when_done = c.close_when_done || m.close_after;
    c.out.pop_front();
    c.sent = 0;
  }
  if (!c.out.empty() || c.close_when_done) lws_callback_on_writable(wsi);
  return 0;
}

int LwsEndpoint::on_callback(lws* wsi, int reason, void* in, std::size_t len) {
  switch (reason) {
    case LWS_CALLBACK_OPENSSL_PERFORM_CLIENT_CERT_VERIFICATION:
      // `len` is OpenSSL's pre-verification result: 0 means the chain did not verify
      // against our CA (REQUIRE_VALID_OPENSSL_CLIENT_CERT alone lets self-signed ones in).
      return len == 0 ? 1 : 0;

    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_CLIENT_ESTABLISHED: {
      const uint64_t id = next_id_++;
      if (reason == LWS_CALLBACK_CLIENT_ESTABLISHED) client_reported_ = false;
      auto c = std::make_unique<Connection>();
      c->wsi = wsi;
      connections_[id] = std::move(c);
      ids_[wsi] = id;
      push_event({EndpointEvent::Kind::Connected, id, {}, peer_common_name(wsi)});
      return 0;
    }

    case LWS_CALLBACK_RECEIVE:
    case LWS_CALLBACK_CLIENT_RECEIVE: {
      Connection* c = connection_of(wsi);
      if (!c) return -1;
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
        c->out.push_back({ids_[wsi], std::vector<uint8_t>(bytes.begin(), bytes.end()), false});
        lws_callback_on_writable(wsi);
        return 0;
      }
      c->rx.insert(c->rx.end(), static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + len);
      if (!final) return 0;
      push_event({EndpointEvent::Kind::Message, ids_[wsi], Frame::copy_of(c->rx.data(), c->rx.size()), {}});
      c->rx.clear();
      std::lock_guard<std::mutex> lock(mutex_);
      if (events_.size() >= options_.queue_depth) {  // the consumer lags: stop reading this peer
        lws_rx_flow_control(wsi, 0);
        paused_.push_back(wsi);
      }
      return 0;
    }

    case LWS_CALLBACK_SERVER_WRITEABLE:
    case LWS_CALLBACK_CLIENT_WRITEABLE: {
      Connection* c = connection_of(wsi);
      return c ? write_some(wsi, *c) : 0;
    }

    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_CLIENT_CLOSED: {
      if (reason == LWS_CALLBACK_CLIENT_CLOSED) client_reported_ = true;
      auto it = ids_.find(wsi);
      if (it == ids_.end()) return 0;
      const uint64_t id = it->second;
      ids_.erase(it);
      connections_.erase(id);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        std::erase(paused_, wsi);
      }
      push_event({EndpointEvent::Kind::Closed, id, {}, "connection closed"});
      return 0;
    }

    case LWS_CALLBACK_WSI_DESTROY:
      // A client connection that ends during the TLS or WebSocket handshake (the server
      // refused our certificate, say) may get no CONNECTION_ERROR: report it here, once.
      if (!server_ && !client_reported_) {
        client_reported_ = true;
        push_event({EndpointEvent::Kind::Closed, 0, {}, "connection closed during the handshake"});
      }
      return kUseDefault;

    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
      client_reported_ = true;
      push_event({EndpointEvent::Kind::Closed, 0, {},
                  cat("connection failed: ", in ? std::string(static_cast<const char*>(in), len ? len : std::strlen(static_cast<const char*>(in))) : std::string("no reason given"))});
      return 0;

    case LWS_CALLBACK_EVENT_WAIT_CANCELLED: {
      std::deque<Outgoing> moved;
      std::vector<lws*> resume;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        moved.swap(outbox_);
        if (resume_reading_) {
          resume.swap(paused_);
          resume_reading_ = false;
        }
      }
      for (lws* w : resume)
        if (ids_.count(w)) lws_rx_flow_control(w, 1);
      for (Outgoing& m : moved) {
        uint64_t id = m.connection;
        if (!server_ && id == 0 && !connections_.empty()) id = connections_.begin()->first;
        auto it = connections_.find(id);
        // Closed meanwhile, or refused by the transport (the Error must be the last word).
        if (it == connections_.end() || it->second->close_after_discard) continue;
        it->second->out.push_back(std::move(m));
        lws_callback_on_writable(it->second->wsi);
      }
      return 0;
    }

    default:
      return kUseDefault;
  }
}

}  // namespace tandem
