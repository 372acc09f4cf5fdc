// WebSocket frames (RFC 6455 section 5.2) as a client writes and reads them: its own frames
// built in one pass and masked 8 bytes at a time, the server's headers parsed and checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

// Largest header: 2 bytes, 8 of extended length, 4 of mask key.
constexpr std::size_t kMaxClientFrameHeader = 14;

namespace ws_opcode {
constexpr uint8_t kContinuation = 0x0, kText = 0x1, kBinary = 0x2, kClose = 0x8, kPing = 0x9, kPong = 0xA;
}

// Writes a masked binary frame (continuation unless `first`, FIN when `last`) carrying
// payload[0, n) into dst, which has room for kMaxClientFrameHeader + n bytes; returns the
// frame's length.
std::size_t write_client_frame(uint8_t* dst, const uint8_t* payload, std::size_t n, bool first, bool last,
                               uint32_t mask_key);
// A masked control frame (close, ping, pong: n <= 125), FIN set; returns its length.
std::size_t write_client_control_frame(uint8_t* dst, uint8_t opcode, const uint8_t* payload, std::size_t n,
                                       uint32_t mask_key);

struct ServerFrameHeader {
  bool fin = false;
  uint8_t opcode = 0;
  uint64_t length = 0;  // of the payload
  std::size_t size = 0;  // of the header
};

// Reads the header of a frame from the server at p[0, n). Returns false when more bytes are
// needed (or `error` is set: a rule the server broke, e.g. a masked frame, RFC 6455 5.1);
// true with `h` filled in.
bool read_server_frame_header(const uint8_t* p, std::size_t n, ServerFrameHeader& h, std::string& error);

}  // namespace tandem
