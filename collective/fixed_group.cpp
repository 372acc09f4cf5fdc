#include "collective/fixed_group.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

struct Session {
  uint64_t generation = 0;
  std::vector<std::string> nonces;  // per member (member 0's is "-")
};

Session parse_session(const std::string& text) {
  Session s;
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word != "generation" || !(in >> s.generation)) return {};
  while (in >> word) s.nonces.push_back(word);
  return s;
}

std::string fresh_nonce() {
  std::random_device device;
  std::mt19937_64 mix((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                      (static_cast<uint64_t>(::getpid()) << 16));
  return cat(std::hex, mix(), mix());
}

}  // namespace

FixedGroup::FixedGroup(FixedGroupOptions options) : options_(std::move(options)) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size)
    fail(options_.what, cat("member ", options_.rank, " of a group of ", options_.size));
  if (options_.dir.empty() || options_.name.empty()) fail(options_.what, "no rendezvous folder or name");
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) fail(options_.what, cat("cannot make the rendezvous folder '", options_.dir, "': ", ec.message()));
}

std::string FixedGroup::path(const std::string& file) const { return cat(options_.dir, "/", options_.name, ".", file); }

void FixedGroup::write(const std::string& file, const std::string& text) const {
  const std::string to = path(file), tmp = cat(to, ".tmp", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) fail(options_.what, cat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, to, ec);
  if (ec) fail(options_.what, cat("cannot write ", to, ": ", ec.message()));
}

std::string FixedGroup::read(const std::string& file) const {
  std::ifstream in(path(file));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void FixedGroup::form() {
  if (group_) drop();
  if (options_.size == 1) return;  // alone: nothing to meet
  options_.rank == 0 ? lead() : follow();
}

void FixedGroup::lead() {
  const Session last = parse_session(read("session"));
  const auto deadline = Clock::now() + options_.form_timeout;
  std::vector<std::string> nonces(static_cast<std::size_t>(options_.size), "-");
  for (int r = 1; r < options_.size;) {
    std::string nonce = read(cat("member", r));
    nonce.erase(std::remove_if(nonce.begin(), nonce.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
                nonce.end());
    if (!nonce.empty() && std::find(last.nonces.begin(), last.nonces.end(), nonce) == last.nonces.end()) {
      nonces[static_cast<std::size_t>(r++)] = nonce;
      continue;
    }
    if (Clock::now() >= deadline)
      throw GroupLost(cat("[", options_.what, "] member ", r, " of ", options_.size, " did not (re)start within ",
                          static_cast<double>(options_.form_timeout.count()) / 1000.0, " s (it announces itself in ",
                          path(cat("member", r)),
                          ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  generation_ = std::max(last.generation, generation_) + 1;
  std::string text = cat("generation ", generation_, "\n");
  for (const std::string& n : nonces) text += n + "\n";
  write("session", text);
  join();
}

void FixedGroup::follow() {
  // A nonce stands until a session names it: an announcement member 0 may have read just
  // before this member's last wait ended stays good, so the next session can name it.
  if (nonce_.empty()) nonce_ = fresh_nonce();
  const std::string nonce = nonce_;
  write(cat("member", options_.rank), nonce + "\n");
  const auto deadline = Clock::now() + options_.form_timeout;
  for (;;) {
    const Session s = parse_session(read("session"));
    if (s.nonces.size() == static_cast<std::size_t>(options_.size) &&
        s.nonces[static_cast<std::size_t>(options_.rank)] == nonce) {
      generation_ = s.generation;
      nonce_.clear();  // spent: member 0 never takes a nonce of its last session again
      break;
    }
    if (Clock::now() >= deadline)
      throw GroupLost(cat("[", options_.what, "] member 0 formed no session with member ", options_.rank, " within ",
                          static_cast<double>(options_.form_timeout.count()) / 1000.0, " s (it writes ",
                          path("session"), ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  join();
}

void FixedGroup::drop() {
  const Stats s = group_->stats();
  before_.collectives += s.collectives;
  before_.bytes += s.bytes;
  before_.seconds += s.seconds;
  group_.reset();
}

void FixedGroup::join() {
  GlooOptions g;
  g.store_dir = options_.dir;
  g.prefix = cat(options_.name, ".", generation_);
  g.address = options_.address;
  g.allow_public = options_.allow_public;
  g.timeout = options_.meet_timeout;
  g.collective_timeout = options_.timeout;
  g.what = options_.what;
  group_ = make_gloo_group(options_.rank, options_.size, g);
}

template <typename F>
void FixedGroup::run(F&& f) {
  if (!group_)
    throw GroupLost(cat("[", options_.what, "] member ", options_.rank, " of ", options_.size,
                        " holds no session: form() one"));
  try {
    f(*group_);
  } catch (const GroupLost&) {
    drop();
    throw;
  }
  const Stats s = group_->stats();
  stats_ = {before_.collectives + s.collectives, before_.bytes + s.bytes, before_.seconds + s.seconds};
}

void FixedGroup::all_sum(std::span<float> values) {
  run([&](Group& g) { g.all_sum(values); });
}
void FixedGroup::broadcast(std::span<float> values, int root) {
  run([&](Group& g) { g.broadcast(values, root); });
}
void FixedGroup::barrier() {
  run([&](Group& g) { g.barrier(); });
}

}  // namespace tandem
