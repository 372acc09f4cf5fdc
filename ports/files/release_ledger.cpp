#include "ports/files/release_ledger.h"

#include <cstdio>
#include <filesystem>
#include <span>

#include "core/error.h"
#include "ports/files/atomic_file.h"

namespace tandem {
namespace {

std::string text_of(const std::string& plan, uint64_t count) {
  return cat("tandem dp releases 1\nplan ", plan, "\nreleases ", count, "\n");
}

}  // namespace

ReleaseLedger::ReleaseLedger(const std::string& dir, const std::string& plan_hex)
    : path_(dir + "/dp-releases"), plan_(plan_hex) {
  std::filesystem::create_directories(dir);
  if (!std::filesystem::exists(path_)) return;
  const std::vector<uint8_t> bytes = read_file(path_);
  const std::string text(bytes.begin(), bytes.end());
  char plan[65] = {};
  unsigned long long count = 0;
  // Read back only what this class writes, to the byte.
  if (std::sscanf(text.c_str(), "tandem dp releases 1 plan %64s releases %llu", plan, &count) != 2 ||
      text != text_of(plan, count))
    fail("privacy", cat(path_, " is not a release count tandem wrote: move it away (its epsilon is then unknown)"));
  if (plan_ != plan)
    fail("privacy", cat(path_, " counts the releases of another plan (another noise, batch or data: its epsilon does "
                        "not simply add up): start in another checkpoint folder"));
  releases_ = count;
}

void ReleaseLedger::write(uint64_t count) {
  const std::string text = text_of(plan_, count);
  write_file_atomic(path_, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  releases_ = count;
}

}  // namespace tandem
