// A client's WebSocket data frame (RFC 6455 section 5.2) built in one pass: header, mask key
// and the payload XOR-masked 8 bytes at a time (lws 4.1 masks client frames byte by byte).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

// Largest header: 2 bytes, 8 of extended length, 4 of mask key.
constexpr std::size_t kMaxClientFrameHeader = 14;

// Writes a masked binary frame (continuation unless `first`, FIN when `last`) carrying
// payload[0, n) into dst, which has room for kMaxClientFrameHeader + n bytes; returns the
// frame's length.
std::size_t write_client_frame(uint8_t* dst, const uint8_t* payload, std::size_t n, bool first, bool last,
                               uint32_t mask_key);

}  // namespace tandem
