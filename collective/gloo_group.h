// The CPU engine behind Group: Gloo (Debian's libgloo, the engine under torch.distributed's
// "gloo" backend) with its TCP transport, the members meeting through a rendezvous store.
//
// The store is Gloo's FileStore: a folder every member can read and write (a local folder for
// processes on one machine; shared storage, NFS or a cluster file system, across machines).
// Debian's Gloo is built without a TCP store, and a Redis server would be one more service
// for a hospital's or a cloud's operator to run and secure; a folder is what a replica set
// already has for its checkpoints. Each membership epoch meets under its own prefix in it,
// so a new group never reads an old one's addresses (torchft's pattern).
//
// Gloo's TCP transport is neither encrypted nor authenticated: anyone who reaches its port
// can read the gradients and send false ones. A group binds only to a private address
// (loopback, RFC 1918, link-local, IPv6 unique-local) unless `allow_public` says the operator
// has put the network behind something else (a VPN, a private interconnect).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "collective/group.h"

namespace tandem {

struct GlooOptions {
  std::string store_dir;  // the rendezvous folder (FileStore), made when missing
  std::string prefix;     // this group's keys in it: one prefix a membership epoch
  std::string address = "127.0.0.1";  // the interface address this member listens on
  bool allow_public = false;
  std::chrono::milliseconds timeout{30000};  // meeting the others, and each collective
  // Each collective's, when other than the meeting's (0: the same): a member that waits on
  // another's work between collectives (a layer shard awaiting its next call) waits long.
  std::chrono::milliseconds collective_timeout{0};
  std::string what = "replica group";  // what the group is, for its errors
};

// Joins the group as `rank` of `size`: returns once every member has reached the store and
// the full mesh of TCP connections is up. An Error naming what is wrong for a bad rank or
// size, a public address without allow_public, or an address that is not this machine's;
// GroupLost when the others do not all arrive within the timeout. The process ignores SIGPIPE
// from then on (a write to a dead member's closed socket fails instead of ending it).
std::unique_ptr<Group> make_gloo_group(int rank, int size, const GlooOptions& options);

// Whether `address` (a numeric IPv4 or IPv6 address, or "localhost") is private: loopback,
// 10/8, 172.16/12, 192.168/16, 169.254/16, fc00::/7 or fe80::/10.
bool private_address(const std::string& address);

}  // namespace tandem
