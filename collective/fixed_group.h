// A group of a fixed number of members that forms again after one is lost: the layer shards
// of a stage (pipeline/layer_shards.h), where every member holds a slice of the weights and
// the others cannot go on without it. Unlike a replica set's Membership, which drops the
// lost and goes on with fewer, this one waits for the member to come back (started again
// with the same command) and then forms anew.
//
// The members meet in a folder (Gloo's FileStore, as a replica set does). Each session of
// the group is a fresh Gloo group under its own prefix, "<name>.<generation>". Member r > 0
// announces itself in "<name>.member<r>" with a fresh random nonce each time it (re)joins;
// member 0 waits until every other member has announced a nonce the last session did not
// hold, writes "<name>.session" (the new generation and the nonces it takes), and all join.
// A stale announcement (a member that died before it ever joined, or a run's before) cannot
// fool it for long: the session it names fails to meet within meet_timeout, and the next takes
// only nonces that session did not name (the caller forms again). A stale session cannot fool
// a member: it names the member's nonce only once member 0 has seen it. A member's nonce
// stands until a session names it, then it draws a fresh one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective/gloo_group.h"

namespace tandem {

struct FixedGroupOptions {
  std::string dir;   // the rendezvous folder, made when missing
  std::string name;  // the group's files in it: "<name>.member<r>", "<name>.session"
  int rank = 0, size = 1;
  std::string address = "127.0.0.1";  // the interface this member listens on (private)
  bool allow_public = false;
  std::chrono::milliseconds form_timeout{120000};  // the wait for the others to (re)arrive
  std::chrono::milliseconds meet_timeout{30000};   // then for the session's Gloo group to meet
  std::chrono::milliseconds timeout{300000};       // each collective, waits between them included
  std::string what = "layer-shard group";          // for errors
};

class FixedGroup final : public Group {
 public:
  explicit FixedGroup(FixedGroupOptions options);

  // Forms a new session of the group (after a loss too): returns once every member has
  // joined it. GroupLost when they do not within form_timeout (call it again to keep waiting).
  void form();
  bool formed() const { return group_ != nullptr; }
  uint64_t generation() const { return generation_; }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  // GroupLost when the session is lost (a member died or stayed silent past the timeout) or
  // none is formed; form() makes the next.
  void all_sum(std::span<float> values) override;
  void broadcast(std::span<float> values, int root) override;
  void barrier() override;

 private:
  template <typename F>
  void run(F&& f);
  std::string path(const std::string& file) const;
  void write(const std::string& file, const std::string& text) const;  // atomically
  std::string read(const std::string& file) const;                    // "" when missing
  void lead();    // member 0's side of form()
  void follow();  // the others'
  void join();    // this session's Gloo group
  void drop();    // the session gone: its counts kept in before_

  FixedGroupOptions options_;
  std::unique_ptr<Group> group_;
  uint64_t generation_ = 0;
  std::string nonce_;  // a member's announcement no session has named yet
  Stats before_;  // the sessions' before this one
};

}  // namespace tandem
