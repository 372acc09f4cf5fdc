// Layer shards of a stage (tensor parallel, Megatron-style): the members of a shard group each
// hold a slice of some layers' weights, and two ops join their partial results through a
// Reducer the caller gives the Network (Network::set_reducer; collective/'s Group behind it,
// pipeline/layer_shards.h). Core knows only this interface: the engines live in collective/.
#pragma once

#include <span>

namespace tandem {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // Sums `values` element-wise over the shard group's members, in place, every member ending
  // with the same bits. Every member calls it in the same order.
  virtual void all_sum(std::span<float> values) = 0;
};

}  // namespace tandem
