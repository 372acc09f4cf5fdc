// The browser's WebSocket (Emscripten's websocket API; the page's TLS) behind whole-message
// callbacks on the page's event loop. Binary messages only, each checked against a size cap.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/wire/frame.h"

namespace tandem {

class BrowserSocket {
 public:
  struct Handlers {
    std::function<void()> opened;
    std::function<void(Frame)> message;
    std::function<void(const std::string& why)> closed;  // once, for any end
  };
  // Connects to `url` (wss://HOST:PORT/) with the tandem subprotocol.
  BrowserSocket(const std::string& url, Handlers handlers, std::size_t max_message_bytes);
  ~BrowserSocket();
  BrowserSocket(const BrowserSocket&) = delete;
  BrowserSocket& operator=(const BrowserSocket&) = delete;

  bool send(std::span<const uint8_t> bytes);
  void close(const std::string& reason);
  bool closed() const { return closed_; }
  uint64_t bytes_up() const { return up_; }
  uint64_t bytes_down() const { return down_; }

  // Emscripten's callbacks, for the C trampolines only.
  void on_open();
  void on_message(const uint8_t* data, uint32_t size, bool text);
  void on_close(const std::string& why);

 private:
  int socket_ = 0;
  Handlers handlers_;
  std::size_t max_message_bytes_;
  uint64_t up_ = 0, down_ = 0;
  bool closed_ = false;
};

}  // namespace tandem
