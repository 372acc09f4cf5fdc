#include "collective/gloo_group.h"

#include <arpa/inet.h>
#include <csignal>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace tandem {

namespace {

class Timed {
 public:
  Timed(Group::Stats& stats, std::size_t bytes) : stats_(stats), t0_(std::chrono::steady_clock::now()) {
    ++stats_.collectives;
    stats_.bytes += bytes;
  }
  ~Timed() { stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  Group::Stats& stats_;
  std::chrono::steady_clock::time_point t0_;
};

class GlooGroup final : public Group {
 public:
  GlooGroup(std::shared_ptr<gloo::rendezvous::Context> context, std::string name)
      : context_(std::move(context)), name_(std::move(name)), rank_(context_->rank), size_(context_->size),
        timeout_ms_(context_->getTimeout().count()) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_sum(std::span<float> values) override {
    if (values.empty()) return;
    Timed timed(stats_, values.size_bytes());
    run("all-sum", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(values.data(), values.size());
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }

  void broadcast(std::span<float> values, int root) override {
    if (root < 0 || root >= size()) fail(name_, cat("broadcast from member ", root, " of a group of ", size()));
    if (values.empty()) return;
    Timed timed(stats_, values.size_bytes());
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(values.data(), values.size());
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    Timed timed(stats_, 0);
    run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  template <typename F>
  void run(const char* what, F&& f) {
    if (lost_) throw GroupLost(cat("[", name_, "] a ", what, " on a group an earlier collective lost: build a new one"));
    try {
      f();
    } catch (const std::exception& e) {
      lost_ = true;
      // Gloo wakes only the operations on the failed connection: closing every connection now
      // makes the other members' pending operations fail at once too, rather than after their
      // timeout, so all survivors re-form within the same settle window.
      context_.reset();
      throw GroupLost(cat("[", name_, "] the ", what, " did not complete (a member closed, died or stayed silent for ",
                          timeout_ms_, " ms): ", e.what()));
    }
  }
  uint32_t next_tag() { return tag_++ & 0x7fffffffu; }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::string name_;
  int rank_, size_;
  int64_t timeout_ms_;
  uint32_t tag_ = 0;
  bool lost_ = false;
};

bool in_v4(const in_addr& a, const char* net, int bits) {
  in_addr n{};
  inet_pton(AF_INET, net, &n);
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (ntohl(a.s_addr) & mask) == (ntohl(n.s_addr) & mask);
}

}  // namespace

bool private_address(const std::string& address) {
  if (address == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1)
    return in_v4(v4, "127.0.0.0", 8) || in_v4(v4, "10.0.0.0", 8) || in_v4(v4, "172.16.0.0", 12) ||
           in_v4(v4, "192.168.0.0", 16) || in_v4(v4, "169.254.0.0", 16);
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    static const uint8_t loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (std::memcmp(v6.s6_addr, loopback, 16) == 0) return true;
    if ((v6.s6_addr[0] & 0xfe) == 0xfc) return true;                             // fc00::/7
    if (v6.s6_addr[0] == 0xfe && (v6.s6_addr[1] & 0xc0) == 0x80) return true;  // fe80::/10
    return false;
  }
  return false;
}

std::unique_ptr<Group> make_gloo_group(int rank, int size, const GlooOptions& options) {
  const std::string name = cat(options.what, " ", options.prefix.empty() ? "" : "'" + options.prefix + "' ", "(member ",
                               rank, " of ", size, ")");
  if (size < 1 || rank < 0 || rank >= size) fail(options.what, cat("member ", rank, " of a group of ", size));
  if (options.store_dir.empty()) fail(name, "no rendezvous folder: name one every member can reach");
  if (!options.allow_public && !private_address(options.address))
    fail(name, cat("'", options.address,
                   "' is not a private address, and Gloo's TCP transport is neither encrypted nor authenticated: "
                   "bind the replicas to a private interface (loopback, 10/8, 172.16/12, 192.168/16, 169.254/16, fc00::/7, "
                   "fe80::/10), or "
                   "allow a public one only behind a VPN or a private interconnect"));
  // Gloo's TCP transport writes to sockets a dead member's end may have closed: the write must
  // fail (GroupLost), not raise SIGPIPE and end this process (Python ignores it likewise).
  std::signal(SIGPIPE, SIG_IGN);
  std::error_code ec;
  std::filesystem::create_directories(options.store_dir, ec);
  if (ec) fail(name, cat("cannot make the rendezvous folder '", options.store_dir, "': ", ec.message()));
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.address;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail(name, cat("cannot listen on '", options.address, "' (is it this machine's address?): ", e.what()));
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.timeout);
  try {
    gloo::rendezvous::FileStore files(options.store_dir);
    gloo::rendezvous::PrefixStore store(options.prefix, files);
    context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    throw GroupLost(cat("[", name, "] the members did not all meet in '", options.store_dir, "' within ",
                        options.timeout.count(), " ms: ", e.what()));
  }
  if (options.collective_timeout.count() > 0) context->setTimeout(options.collective_timeout);
  return std::make_unique<GlooGroup>(std::move(context), name);
}

}  // namespace tandem
