#include "ports/lws/http_listener.h"

#include <libwebsockets.h>

#include <cstring>

#include "core/error.h"

namespace tandem {
namespace {

int http_trampoline(lws* wsi, lws_callback_reasons reason, void* user, void* in, size_t len) {
  lws_context* ctx = wsi ? lws_get_context(wsi) : nullptr;
  auto* self = ctx ? static_cast<HttpListener*>(lws_context_user(ctx)) : nullptr;
  return self ? self->on_callback(wsi, static_cast<int>(reason), in, len)
              : lws_callback_http_dummy(wsi, reason, user, in, len);
}

const lws_protocols kHttpProtocols[] = {
    {"http", http_trampoline, 0, 0, 0, nullptr, 0},
    {nullptr, nullptr, 0, 0, 0, nullptr, 0},
};

}  // namespace

std::unique_ptr<HttpListener> HttpListener::listen(const std::string& host, int port, Handler handler) {
  std::unique_ptr<HttpListener> l(new HttpListener);
  l->handler_ = std::move(handler);
  lws_context_creation_info info;
  std::memset(&info, 0, sizeof info);
  info.port = port;
  info.iface = host.c_str();
  info.protocols = kHttpProtocols;
  info.user = l.get();
  info.options = LWS_SERVER_OPTION_DISABLE_IPV6;
  info.timeout_secs = 10;
  l->context_ = lws_create_context(&info);
  if (!l->context_) fail("transport", cat("cannot listen for HTTP on ", host, ":", port, " (port in use?)"));
  l->port_ = lws_get_vhost_listen_port(lws_get_vhost_by_name(l->context_, "default"));
  HttpListener* self = l.get();
  l->thread_ = std::thread([self] {
    while (!self->stopping_ && lws_service(self->context_, 0) >= 0) {
    }
  });
  return l;
}

HttpListener::~HttpListener() {
  stopping_ = true;
  if (context_) lws_cancel_service(context_);
  if (thread_.joinable()) thread_.join();
  if (context_) lws_context_destroy(context_);
}

int HttpListener::on_callback(lws* wsi, int reason, void* in, std::size_t len) {
  switch (reason) {
    case LWS_CALLBACK_HTTP: {
      std::string path = in ? std::string(static_cast<const char*>(in)) : "/";
      path = path.substr(0, path.find('?'));
      HttpResponse r = handler_(path);
      unsigned char head[LWS_PRE + 1024];
      unsigned char *start = head + LWS_PRE, *p = start, *end = head + sizeof head - 1;
      if (lws_add_http_common_headers(wsi, static_cast<unsigned int>(r.status), r.content_type.c_str(),
                                      r.body.size(), &p, end) ||
          lws_finalize_write_http_header(wsi, start, &p, end))
        return 1;
      Pending& pending = pending_[wsi];
      pending.head_and_body.assign(LWS_PRE, '\0');
      pending.head_and_body += r.body;
      pending.sent = 0;
      lws_callback_on_writable(wsi);
      return 0;
    }
    case LWS_CALLBACK_HTTP_WRITEABLE: {
      auto it = pending_.find(wsi);
      if (it == pending_.end()) return 0;
      Pending& pd = it->second;
      const std::size_t body = pd.head_and_body.size() - LWS_PRE;
      const std::size_t chunk = std::min<std::size_t>(16384, body - pd.sent);
      const bool last = pd.sent + chunk == body;
      // lws_write may write into the LWS_PRE bytes before the data: each chunk is copied to a
      // buffer that has them.
      std::string buf(LWS_PRE, '\0');
      buf.append(pd.head_and_body, LWS_PRE + pd.sent, chunk);
      if (lws_write(wsi, reinterpret_cast<unsigned char*>(buf.data()) + LWS_PRE, chunk,
                    last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) != static_cast<int>(chunk))
        return 1;
      pd.sent += chunk;
      if (!last) {
        lws_callback_on_writable(wsi);
        return 0;
      }
      pending_.erase(it);
      return lws_http_transaction_completed(wsi) ? -1 : 0;
    }
    case LWS_CALLBACK_CLOSED_HTTP:
      pending_.erase(wsi);
      return 0;
    default:
      return lws_callback_http_dummy(wsi, static_cast<lws_callback_reasons>(reason), nullptr, in, len);
  }
}

}  // namespace tandem
