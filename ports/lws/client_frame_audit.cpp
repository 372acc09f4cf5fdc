#include "ports/lws/client_frame_audit.h"

#include <dlfcn.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

namespace tandem {
namespace {

// The index of our slot in every SSL object's ex_data; the audit is deleted with the SSL.
void free_audit(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<ClientFrameAudit*>(ptr); }

int audit_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_audit);
  return index;
}

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

void ClientFrameAudit::feed(const uint8_t* data, std::size_t size) {
  std::size_t i = 0;
  while (i < size && violation_.empty()) {
    switch (state_) {
      case State::Http: {
        request_.push_back(static_cast<char>(data[i++]));
        if (request_.size() > 16384) request_.clear();  // lws refuses such headers itself
        if (request_.size() >= 4 && request_.compare(request_.size() - 4, 4, "\r\n\r\n") == 0) {
          if (lowercase(request_).find("upgrade: websocket") != std::string::npos) state_ = State::Header;
          request_.clear();
        }
        break;
      }
      case State::Header: {
        header_[header_size_++] = data[i++];
        if (header_size_ < 2) break;
        const uint8_t len7 = header_[1] & 0x7f;
        const std::size_t need = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + 4;
        if (!(header_[1] & 0x80)) {
          violation_ = "a client frame without a mask (RFC 6455 section 5.1: every client frame is masked)";
          break;
        }
        if (header_size_ < need) break;
        uint64_t length = len7;
        if (len7 == 126) length = (uint64_t{header_[2]} << 8) | header_[3];
        if (len7 == 127) {
          length = 0;
          for (int b = 0; b < 8; ++b) length = (length << 8) | header_[2 + b];
        }
        header_size_ = 0;
        payload_left_ = length;
        state_ = length ? State::Payload : State::Header;
        break;
      }
      case State::Payload: {
        const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(payload_left_, size - i));
        i += n;
        payload_left_ -= n;
        if (!payload_left_) state_ = State::Header;
        break;
      }
    }
  }
}

std::string client_frame_violation(SSL* ssl) {
  if (!ssl) return "";
  const auto* audit = static_cast<ClientFrameAudit*>(SSL_get_ex_data(ssl, audit_index()));
  return audit ? audit->violation() : "";
}

}  // namespace tandem

// libwebsockets reads a connection's plaintext with SSL_read and exposes neither the bytes
// nor the mask bit. This definition in the executable interposes OpenSSL's (the dynamic
// linker binds libwebsockets' reference to it), calls the real one, and feeds what a server
// connection read to its audit. Client connections and other processes are not touched.
extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  using Read = int (*)(SSL*, void*, int);
  static const Read real = reinterpret_cast<Read>(dlsym(RTLD_NEXT, "SSL_read"));
  const int n = real(ssl, buf, num);
  if (n > 0 && SSL_is_server(ssl)) {
    auto* audit = static_cast<tandem::ClientFrameAudit*>(SSL_get_ex_data(ssl, tandem::audit_index()));
    if (!audit) {
      audit = new tandem::ClientFrameAudit;
      SSL_set_ex_data(ssl, tandem::audit_index(), audit);
    }
    audit->feed(static_cast<const uint8_t*>(buf), static_cast<std::size_t>(n));
  }
  return n;
}
