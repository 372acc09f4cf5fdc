// A group of processes that reduce together, the shape of mlx's distributed::Group and of
// torch.distributed's process groups: a rank among `size`, an all-sum, a broadcast and a
// barrier, each a collective every member calls in the same order. The replicas of a stage
// (pipeline/replicas.h) keep their weights equal through one; the engine behind it is Gloo
// over TCP (collective/gloo_group.h) on CPUs, and NCCL is the GPU engine behind the same
// interface. A member that dies or stays silent past the group's timeout makes the next
// collective throw GroupLost on every other member: the group is then spent, and the
// replicas build a new one for the next membership epoch.
#pragma once

#include <cstdint>
#include <span>

#include "core/error.h"

namespace tandem {

// A collective did not complete: a member closed its connection, died or stayed silent past
// the timeout. The group cannot be used again.
class GroupLost : public Error {
 public:
  using Error::Error;
};

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `values` element-wise across the members, in place: every member ends with the same
  // bits (the engine reduces once and hands every member that result).
  virtual void all_sum(std::span<float> values) = 0;
  // Every member's `values` become member `root`'s.
  virtual void broadcast(std::span<float> values, int root) = 0;
  // Returns once every member has called it.
  virtual void barrier() = 0;

  // What the collectives cost so far: each one's payload bytes (what one member hands in) and
  // the seconds spent inside them (network, reduction and waiting for the slowest member).
  struct Stats {
    uint64_t collectives = 0;
    uint64_t bytes = 0;
    double seconds = 0;
  };
  const Stats& stats() const { return stats_; }

 protected:
  Stats stats_;
};

}  // namespace tandem
