// A small plain-HTTP listener on libwebsockets for operators' endpoints (/metrics, /healthz):
// its own lws context and service thread; each GET's response comes from a handler.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

struct lws;
struct lws_context;

namespace tandem {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpListener {
 public:
  // Called on the listener's thread with the request's path (no query string).
  using Handler = std::function<HttpResponse(const std::string& path)>;
  // Listens on host:port (0: any free port, see port()); throws Error when it cannot.
  static std::unique_ptr<HttpListener> listen(const std::string& host, int port, Handler handler);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;
  int port() const { return port_; }

  // The lws callback, for the C trampoline only.
  int on_callback(lws* wsi, int reason, void* in, std::size_t len);

 private:
  struct Pending {
    std::string head_and_body;  // LWS_PRE bytes, then the body
    std::size_t sent = 0;
  };
  HttpListener() = default;
  Handler handler_;
  lws_context* context_ = nullptr;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::map<lws*, Pending> pending_;  // service thread only
};

}  // namespace tandem
