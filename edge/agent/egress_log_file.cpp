#include "edge/agent/egress_log_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "ports/crypto/fast_sha256.h"

namespace tandem {
namespace {

// The hash the log's last line claims (the chain goes on from it); a new log's genesis.
std::string last_hash_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  std::string claimed, computed;
  if (last.empty()) return EgressAudit::genesis();
  if (!egress_line_hashes(last, claimed, computed))
    fail("audit", cat(path, " does not end with an egress log line (check it with `tandem audit verify ", path,
                      "`, or give the edge another --audit-log)"));
  return claimed;
}

}  // namespace

EgressLogFile::EgressLogFile(const std::string& path)
    : path_(path), audit_([this](const std::string& line) {
        if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) < 0 || std::fflush(file_) != 0)
          fail("audit", cat("cannot append to the egress log ", path_, ": ", std::strerror(errno)));
      }, last_hash_of(path), fast_sha256) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) file_ = ::fdopen(fd, "a");
  if (!file_) {
    if (fd >= 0) ::close(fd);
    fail("audit", cat("cannot open the egress log ", path, ": ", std::strerror(errno),
                      " (give the edge a writable --audit-log FILE)"));
  }
}

EgressLogFile::~EgressLogFile() {
  try {
    if (!finished_) finish("interrupted");
  } catch (const Error&) {  // a destructor reports nothing more than what failed already
  }
  std::fclose(file_);
}

std::string EgressLogFile::finish(const std::string& outcome) {
  finished_ = true;
  const std::string last = audit_.finish(outcome);
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    fail("audit", cat("cannot sync the egress log ", path_, ": ", std::strerror(errno)));
  return last;
}

}  // namespace tandem
