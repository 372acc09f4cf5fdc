// Files that survive a crash whole or not at all: write to a temporary file in the same
// folder, fsync it, rename it over the target, fsync the folder.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

// Throws Error("[files] ...") naming the path and the system's reason.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);
std::vector<uint8_t> read_file(const std::string& path);
// Creates the folder and its parents if missing (mode 0700: checkpoints are private).
void make_dirs(const std::string& dir);

}  // namespace tandem
