// Reads 8-byte elements of verified FlatBuffers vectors (tensor shapes) byte-wise, so bytes
// from a peer or a file can never make us load a misaligned int64.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>

namespace tandem {

// The Verifier of flatbuffers 2.0.8 checks a vector's length field for 4-byte alignment only
// (and relative to the buffer's start, which need not be aligned itself), so a hostile buffer
// can place 8-byte elements at a 4-byte boundary: *v, Get(i) and range-for are UB there.
// Found by tests/fuzz (checkpoint) in CI's smoke run.
inline int64_t int64_at(const flatbuffers::Vector<int64_t>& v, flatbuffers::uoffset_t i) {
  int64_t x;
  std::memcpy(&x, v.Data() + static_cast<std::size_t>(i) * sizeof x, sizeof x);
  return flatbuffers::EndianScalar(x);
}

}  // namespace tandem
