#include "collective/membership.h"

#include "collective/nccl_group.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Writes `file` whole: through a temporary of the writer's own (`tag`), renamed over it, or,
// with `first_wins`, linked to it only where no file of that name exists yet (an epoch two
// coordinators might write: every reader then sees the first one's). False where it existed.
bool write_atomically(const std::string& file, const std::string& text, const std::string& tag,
                      bool first_wins = false) {
  const std::string tmp = file + "." + tag + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) fail("membership", cat("cannot write '", tmp, "'"));
  }
  std::error_code ec;
  if (first_wins) {
    const bool made = ::link(tmp.c_str(), file.c_str()) == 0;
    const int error = errno;
    fs::remove(tmp, ec);
    if (!made && error != EEXIST) fail("membership", cat("cannot write '", file, "': ", std::strerror(error)));
    return made;
  }
  fs::rename(tmp, file, ec);
  if (ec) fail("membership", cat("cannot write '", file, "': ", ec.message()));
  return true;
}

std::vector<std::string> read_lines(const std::string& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// The names after `prefix` of the folder's files that start with it (no temporary files).
std::vector<std::string> files_after(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) out.push_back(name.substr(prefix.size()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t latest_epoch(const std::string& dir) {
  uint64_t latest = 0;
  for (const std::string& n : files_after(dir, "epoch-")) {
    char* end = nullptr;
    const uint64_t e = std::strtoull(n.c_str(), &end, 10);
    if (end && *end == '\0') latest = std::max(latest, e);
  }
  return latest;
}

// The first line of a file (a token), or "".
std::string first_line(const std::string& file) {
  const std::vector<std::string> lines = read_lines(file);
  return lines.empty() ? std::string() : lines.front();
}

void nap() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

}  // namespace

std::string Membership::path(const std::string& name) const { return dir_ + "/" + name; }

Membership::Membership(const MembershipOptions& options) : options_(options) {
  if (options_.id.empty() || options_.id.find(".tmp") != std::string::npos ||
      !std::all_of(options_.id.begin(), options_.id.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      }))
    fail("membership", cat("replica id '", options_.id, "': use letters, digits, '.', '_' and '-' (not '.tmp', which "
                           "marks the folder's temporary files)"));
  if (options_.initial < 1) fail("membership", "a replica set forms with at least one replica");
  if (options_.gloo.store_dir.empty()) fail("membership", "no rendezvous folder: name one every replica can reach");
  dir_ = options_.gloo.store_dir + "/membership-" + (options_.gloo.prefix.empty() ? "set" : options_.gloo.prefix);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail("membership", cat("cannot make '", dir_, "': ", ec.message()));
  join();
}

void Membership::rejoin() {
  group_.reset();
  ++stats_.rejoins;
  join();
}

void Membership::join() {
  std::error_code ec;
  {
    std::random_device random;
    token_ = cat(options_.id, "#", std::hex, (uint64_t{random()} << 32) | random());
  }
  write_atomically(path("join-" + options_.id), token_ + "\n", token_);
  const auto deadline = Clock::now() + options_.join_timeout;
  while (Clock::now() < deadline) {
    const uint64_t e = latest_epoch(dir_);
    std::vector<std::string> members = e > 0 ? read_lines(path(cat("epoch-", e))) : std::vector<std::string>{};
    if (std::find(members.begin(), members.end(), token_) != members.end()) {
      fs::remove(path("join-" + options_.id), ec);
      build(e, std::move(members));
      return;
    }
    // No set yet, or one whose every member has stopped (each leaves a file when it ends): the
    // first `initial` replicas asking form the next epoch (the first to write it wins).
    const bool stopped = e > 0 && !members.empty() && std::all_of(members.begin(), members.end(), [&](const std::string& m) {
      return fs::exists(path("left-" + m));
    });
    if (e == 0 || stopped) {
      const std::vector<std::string> waiting = files_after(dir_, "join-");
      if (waiting.size() >= options_.initial && waiting.front() == options_.id)
        write_atomically(
            path(cat("epoch-", e + 1)),
            [&] {
              std::string text;
              for (std::size_t i = 0; i < options_.initial; ++i) text += first_line(path("join-" + waiting[i])) + "\n";
              return text;
            }(),
            token_, true);
    }
    nap();
  }
  fs::remove(path("join-" + options_.id), ec);
  const uint64_t e = latest_epoch(dir_);
  throw GroupLost(cat("[membership] replica '", options_.id, "' was not let into the set in '", dir_, "' within ",
                      options_.join_timeout.count(), " ms (are ", options_.initial,
                      " replicas starting, or a running one taking steps?",
                      e > 0 ? cat(" The folder lists epoch ", e, ": if that set was killed rather than stopped, "
                                  "empty the folder")
                            : std::string(),
                      ")"));
}

Group& Membership::group() {
  if (!group_)
    throw GroupLost(cat("[membership] replica '", options_.id, "': epoch ", epoch_, "'s group did not meet: re-form"));
  return *group_;
}

// A replica that ends says so: a set whose every member has ended is formed anew by the next
// replicas to start in this folder (a set stopped and started again), instead of their
// waiting to be let into one nobody runs.
Membership::~Membership() {
  group_.reset();
  if (!token_.empty()) {
    try {
      write_atomically(path("left-" + token_), token_ + "\n", token_);
    } catch (const Error&) {
      // a folder gone or unwritable: nothing to say it in
    }
  }
}

void Membership::build(uint64_t epoch, std::vector<std::string> members) {
  const auto it = std::find(members.begin(), members.end(), token_);
  const int rank = static_cast<int>(it - members.begin());
  group_.reset();  // the old group's connections close first
  // The epoch is this replica's before its group meets: when the meeting fails (a member lost
  // meanwhile), the next reform goes on from it.
  epoch_ = epoch;
  members_ = std::move(members);
  GlooOptions gloo = options_.gloo;
  gloo.prefix = cat(options_.gloo.prefix.empty() ? "set" : options_.gloo.prefix, ".epoch-", epoch);
  if (options_.engine == "nccl") {
    NcclOptions nccl;
    nccl.store_dir = gloo.store_dir;
    nccl.prefix = gloo.prefix;
    nccl.timeout = gloo.timeout;
    nccl.address = gloo.address;
    nccl.allow_public = gloo.allow_public;
    group_ = make_nccl_group(rank, static_cast<int>(members_.size()), nccl);
    return;
  }
  group_ = make_gloo_group(rank, static_cast<int>(members_.size()), gloo);
}

std::vector<std::string> Membership::waiting() const {
  std::vector<std::string> out;
  for (const std::string& id : files_after(dir_, "join-")) {
    const std::string token = first_line(path("join-" + id));
    if (!token.empty() && std::find(members_.begin(), members_.end(), token) == members_.end()) out.push_back(token);
  }
  return out;
}

bool Membership::joiners() const { return !waiting().empty(); }

void Membership::reform(bool lost) {
  const uint64_t next = epoch_ + 1;
  const std::string epoch_file = path(cat("epoch-", next));
  std::vector<std::string> members;
  if (lost) {
    write_atomically(path(cat("alive-", next, "-", token_)), token_ + "\n", token_);
    std::this_thread::sleep_for(options_.settle);
    std::vector<std::string> said;
    for (const std::string& token : files_after(dir_, cat("alive-", next, "-")))
      said.push_back(first_line(path(cat("alive-", next, "-", token))));
    for (const std::string& m : members_)
      if (std::find(said.begin(), said.end(), m) != said.end()) members.push_back(m);
    if (!members.empty() && members.front() == token_ && latest_epoch(dir_) < next) {
      std::string text;
      for (const std::string& m : members) text += m + "\n";
      write_atomically(epoch_file, text, token_, true);
    }
  } else if (members_.front() == token_) {
    members = members_;
    for (const std::string& token : waiting()) members.push_back(token);
    std::string text;
    for (const std::string& m : members) text += m + "\n";
    write_atomically(epoch_file, text, token_, true);
  }
  // Everyone reads the epoch its coordinator wrote.
  const auto deadline = Clock::now() + options_.settle * 5 + options_.gloo.timeout;
  while (!fs::exists(epoch_file)) {
    if (Clock::now() >= deadline)
      throw GroupLost(cat("[membership] replica '", options_.id, "': no epoch ", next, " was formed in '", dir_,
                          "' (the member that ranks first among the survivors writes it)"));
    nap();
  }
  members = read_lines(epoch_file);
  if (std::find(members.begin(), members.end(), token_) == members.end())
    throw LeftOut(cat("[membership] replica '", options_.id, "' is not in epoch ", next,
                      " (it said it was alive too late, or was silent while the others re-formed): it joins the set "
                      "again"));
  const std::size_t before = members_.size();
  std::size_t kept = 0;
  for (const std::string& m : members)
    if (std::find(members_.begin(), members_.end(), m) != members_.end()) ++kept;
  ++stats_.reforms;
  stats_.dropped += before - kept;
  stats_.joined += members.size() - kept;
  build(next, std::move(members));
}

}  // namespace tandem
