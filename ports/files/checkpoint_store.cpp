#include "ports/files/checkpoint_store.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "ports/files/atomic_file.h"

namespace tandem {
namespace {

constexpr const char* kSuffix = ".tdmc";

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, std::string prefix, std::optional<AesKey> key, int keep)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), key_(key), keep_(std::max(1, keep)) {
  make_dirs(dir_);
}

std::string CheckpointStore::path_of(uint64_t step) const {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%012llu", static_cast<unsigned long long>(step));
  return cat(dir_, "/", prefix_, "-", digits, kSuffix);
}

void CheckpointStore::save(uint64_t step, std::span<const uint8_t> checkpoint) {
  if (key_) {
    const std::vector<uint8_t> sealed = seal_aes_gcm(*key_, checkpoint);
    write_file_atomic(path_of(step), sealed);
  } else {
    write_file_atomic(path_of(step), checkpoint);
  }
  const std::vector<uint64_t> all = steps();
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i)
    if (all[i] < step) ::unlink(path_of(all[i]).c_str());
}

std::vector<uint64_t> CheckpointStore::steps() const {
  std::vector<uint64_t> out;
  std::unique_ptr<DIR, DirCloser> d(::opendir(dir_.c_str()));
  if (!d) return out;
  const std::string head = prefix_ + "-";
  const std::string tail = kSuffix;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.push_back(std::stoull(digits));
  }
  std::sort(out.begin(), out.end());
  return out;
}

CheckpointData CheckpointStore::load_file(const std::string& path) const {
  const std::vector<uint8_t> bytes = read_file(path);
  if (key_) return decode_checkpoint(open_aes_gcm(*key_, bytes));
  if (is_sealed(bytes)) fail("checkpoint", "the file is encrypted and no key was given");
  return decode_checkpoint(bytes);
}

std::optional<CheckpointData> CheckpointStore::load_latest(std::vector<std::string>* refusals) const {
  const std::vector<uint64_t> all = steps();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string path = path_of(*it);
    try {
      CheckpointData d = load_file(path);
      if (d.meta.step != *it) fail("checkpoint", cat("the file says step ", d.meta.step));
      return d;
    } catch (const Error& e) {
      const std::string msg = cat("refused checkpoint ", path, ": ", e.what(),
                                  std::next(it) != all.rend() ? "; trying the previous one" : "; none left");
      std::fprintf(stderr, "%s\n", msg.c_str());
      if (refusals) refusals->push_back(msg);
    }
  }
  return std::nullopt;
}

CheckpointData CheckpointStore::load_step(uint64_t step) const {
  const std::vector<uint64_t> all = steps();
  if (std::find(all.begin(), all.end(), step) == all.end()) {
    std::string have;
    for (uint64_t s : all) have += cat(have.empty() ? "" : ", ", s);
    fail("checkpoint", cat("no checkpoint of step ", step, " in ", dir_, " (it has: ", have.empty() ? "none" : have, ")"));
  }
  CheckpointData d = load_file(path_of(step));
  if (d.meta.step != step) fail("checkpoint", cat(path_of(step), " says step ", d.meta.step));
  return d;
}

}  // namespace tandem
