#include "ports/browser/browser_socket.h"

#include <emscripten/websocket.h>

#include "core/error.h"

namespace tandem {
namespace {

EM_BOOL opened(int, const EmscriptenWebSocketOpenEvent*, void* self) {
  static_cast<BrowserSocket*>(self)->on_open();
  return EM_TRUE;
}
EM_BOOL arrived(int, const EmscriptenWebSocketMessageEvent* e, void* self) {
  static_cast<BrowserSocket*>(self)->on_message(e->data, e->numBytes, e->isText);
  return EM_TRUE;
}
EM_BOOL failed(int, const EmscriptenWebSocketErrorEvent*, void* self) {
  static_cast<BrowserSocket*>(self)->on_close(
      "the connection failed (is tandem-cloud serve running with --accept-tokens, and does this browser trust its "
      "certificate?)");
  return EM_TRUE;
}
EM_BOOL ended(int, const EmscriptenWebSocketCloseEvent* e, void* self) {
  static_cast<BrowserSocket*>(self)->on_close(
      cat("the connection closed (code ", e->code, e->reason[0] ? cat(": ", e->reason) : std::string(), ")"));
  return EM_TRUE;
}

}  // namespace

BrowserSocket::BrowserSocket(const std::string& url, Handlers handlers, std::size_t max_message_bytes)
    : handlers_(std::move(handlers)), max_message_bytes_(max_message_bytes) {
  if (!emscripten_websocket_is_supported()) fail("browser", "this browser has no WebSocket");
  EmscriptenWebSocketCreateAttributes attributes;
  emscripten_websocket_init_create_attributes(&attributes);
  attributes.url = url.c_str();
  attributes.protocols = "tandem.v1";
  const EMSCRIPTEN_WEBSOCKET_T s = emscripten_websocket_new(&attributes);
  if (s <= 0) fail("browser", cat("cannot open a WebSocket to ", url, " (error ", s, ")"));
  socket_ = s;
  emscripten_websocket_set_onopen_callback(socket_, this, opened);
  emscripten_websocket_set_onmessage_callback(socket_, this, arrived);
  emscripten_websocket_set_onerror_callback(socket_, this, failed);
  emscripten_websocket_set_onclose_callback(socket_, this, ended);
}

BrowserSocket::~BrowserSocket() {
  if (!closed_) emscripten_websocket_close(socket_, 1000, "edge stopped");
  emscripten_websocket_delete(socket_);
}

bool BrowserSocket::send(std::span<const uint8_t> bytes) {
  if (closed_) return false;
  up_ += bytes.size();
  return emscripten_websocket_send_binary(socket_, const_cast<uint8_t*>(bytes.data()),
                                          static_cast<uint32_t>(bytes.size())) == EMSCRIPTEN_RESULT_SUCCESS;
}

void BrowserSocket::close(const std::string& reason) {
  if (closed_) return;
  emscripten_websocket_close(socket_, 1000, reason.substr(0, 120).c_str());
  on_close(reason);
}

void BrowserSocket::on_open() {
  if (handlers_.opened) handlers_.opened();
}

void BrowserSocket::on_message(const uint8_t* data, uint32_t size, bool text) {
  if (closed_) return;
  down_ += size;
  if (text) return close("the cloud sent a text message; tandem speaks binary");
  if (size > max_message_bytes_)
    return close(cat("the cloud sent ", size, " bytes, over the limit of ", max_message_bytes_));
  handlers_.message(Frame::copy_of(data, size));
}

void BrowserSocket::on_close(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  if (handlers_.closed) handlers_.closed(why);
}

}  // namespace tandem
