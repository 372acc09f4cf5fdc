// The membership of a replica set, kept in its rendezvous folder (the FileStore's, shared by
// every replica: collective/gloo_group.h says why a folder), as torchft keeps a quorum: each
// membership epoch lists its members, in rank order, and builds a fresh Gloo group under its
// own prefix. Three moves change it:
//
// - forming: the first `initial` replicas to arrive form epoch 1 (ranks in the order of their
//   ids);
// - a member lost: a collective throws GroupLost on the survivors (a dead peer's connection
//   closes at once; a hung one stays silent past the group's timeout). Each survivor says it
//   is alive for the next epoch; after `settle` the first of them (in the old rank order)
//   writes the epoch, of everyone who said so, and all build its group. The dead member's
//   sessions resume on the survivors from their last checkpoint;
// - a replica that joins: it asks (a file); rank 0 notices between steps (joiners()), the
//   members agree on it within that step's collective (pipeline/replicas.h carries the flag),
//   and after the update they move to the next epoch with the joiner last, which then copies
//   the weights and optimizer state from rank 0 before it serves.
//
// A replica that ends (its Membership destroyed) leaves a file saying so; when every member of
// the newest epoch has, the set has stopped, and the next replicas to start form the next
// epoch as the first ones formed epoch 1 (a set killed with -9 leaves no such files: empty
// its folder before starting it again).
//
// The coordinator is no extra service: whichever member ranks first writes the epoch file,
// and a write is atomic (a rename), so a reader sees a whole epoch or none.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective/gloo_group.h"

namespace tandem {

// This replica is not in the epoch the others formed (it said it was alive too late, or was
// dropped while silent): it must join the set again (Membership::rejoin).
class LeftOut : public Error {
 public:
  using Error::Error;
};

struct MembershipOptions {
  GlooOptions gloo;  // store_dir: the replica set's folder; prefix: the set's name
  // The engine each epoch's group runs on: "gloo" (TCP, CPUs) or "nccl" (one GPU a member,
  // collective/nccl_group.h; the set still meets in gloo.store_dir, with gloo.timeout).
  std::string engine = "gloo";
  std::string id;    // this replica's name in the set, unique ([A-Za-z0-9._-])
  uint32_t initial = 1;  // replicas that form epoch 1
  std::chrono::milliseconds settle{2000};  // survivors' window to say they are alive
  std::chrono::milliseconds join_timeout{600000};  // waiting to be let in
};

class Membership {
 public:
  // Joins the set: forms epoch 1 with the first `initial` arrivals, or, when the set runs
  // already, asks to join and waits until an epoch lists it. Returns with group() built.
  explicit Membership(const MembershipOptions& options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The epoch's group; GroupLost when its build failed (a member lost while meeting: reform).
  Group& group();
  uint64_t epoch() const { return epoch_; }
  // The members in rank order, each "ID#NONCE": a replica started again is a new member.
  const std::vector<std::string>& members() const { return members_; }
  // Whether a replica waits to join (rank 0 looks, between steps).
  bool joiners() const;
  // The next epoch: after a GroupLost (`lost`), of the members alive; else (a join agreed on in
  // a collective) of every member and the joiners. LeftOut when this replica is not in it;
  // GroupLost when no epoch was formed in time or its group did not meet (call it again).
  void reform(bool lost);
  // After LeftOut: asks to join under a new identity and waits until an epoch lists it (as a
  // replica started again would); then take a member's state (ReplicaSync::copy_from).
  void rejoin();
  // Epochs formed since this replica joined, members dropped and joined in them.
  struct Stats {
    uint64_t reforms = 0, dropped = 0, joined = 0;
    uint64_t rejoins = 0;  // times this replica was left out and joined again
  };
  const Stats& stats() const { return stats_; }

 private:
  std::string path(const std::string& name) const;
  void join();  // writes the join request and waits until an epoch lists this replica
  std::vector<std::string> waiting() const;  // the joiners' tokens
  void build(uint64_t epoch, std::vector<std::string> members);

  MembershipOptions options_;
  std::string dir_, token_;
  std::unique_ptr<Group> group_;
  uint64_t epoch_ = 0;
  std::vector<std::string> members_;
  Stats stats_;
};

}  // namespace tandem
