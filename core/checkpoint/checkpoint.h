// One shard's training state as bytes and back: parameters, batch-norm statistics, dropout
// counters, optimizer state, step and data cursor. Framed with a SHA-256 so a torn or
// bit-flipped file is refused with a clear Error before anything is restored.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/network.h"
#include "core/optimizer.h"

namespace tandem {

struct CheckpointMeta {
  std::string role;       // edge | cloud | whole
  std::string client_id;  // the edge the shard belongs to
  std::string cut;
  std::array<uint8_t, 32> model_hash{};
  uint64_t step = 0;                  // optimizer steps completed
  int64_t epoch = 1, cursor = 0;      // data cursor: epoch (1-based) and samples of it consumed
};

struct NamedTensor {
  std::string name;
  Tensor value;
};

struct CheckpointData {
  CheckpointMeta meta;
  std::string optimizer_kind;  // empty: no optimizer state saved
  int64_t optimizer_steps = 0;
  std::vector<NamedTensor> params, buffers, optimizer_state;
  std::vector<std::pair<std::string, uint64_t>> counters;
};

// "TDMCKPT1", the payload's length (u64 little-endian), the FlatBuffers payload
// (schema/checkpoint.fbs) and its SHA-256.
// `nets`: one model in parts with distinct parameter names (a U-shaped edge: front and tail),
// saved as one; `optimizer` holds them all.
std::vector<uint8_t> encode_checkpoint(const CheckpointMeta& meta, std::span<Network* const> nets, Optimizer* optimizer);
inline std::vector<uint8_t> encode_checkpoint(const CheckpointMeta& meta, Network& net, Optimizer* optimizer) {
  Network* const one[] = {&net};
  return encode_checkpoint(meta, one, optimizer);
}

// Checks the frame, the checksum, the FlatBuffers verifier and every tensor's shape against
// its data; throws Error("[checkpoint] ...") saying what is wrong.
CheckpointData decode_checkpoint(std::span<const uint8_t> bytes);

// Checks that the checkpoint fits (same parameter names and shapes, buffers, counters, and
// optimizer kind when one is given) before changing anything, then copies the state in.
void restore_checkpoint(const CheckpointData& data, std::span<Network* const> nets, Optimizer* optimizer);
inline void restore_checkpoint(const CheckpointData& data, Network& net, Optimizer* optimizer) {
  Network* const one[] = {&net};
  restore_checkpoint(data, one, optimizer);
}

}  // namespace tandem
