#include "ports/files/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace tandem {
namespace {

struct FdCloser {
  void operator()(const int* fd) const {
    if (*fd >= 0) ::close(*fd);
    delete fd;
  }
};
using Fd = std::unique_ptr<int, FdCloser>;

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  fail("files", cat(what, " ", path, ": ", std::strerror(errno)));
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  {
    Fd fd(new int(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)));
    if (*fd < 0) fail_errno("cannot create", tmp);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(*fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int saved = errno;
        ::unlink(tmp.c_str());
        errno = saved;
        fail_errno("cannot write", tmp);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(*fd) != 0) fail_errno("cannot fsync", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_errno("cannot rename into", path);
  const std::string dir = parent_of(path);
  Fd dfd(new int(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  if (*dfd < 0 || ::fsync(*dfd) != 0) fail_errno("cannot fsync the folder", dir);
}

std::vector<uint8_t> read_file(const std::string& path) {
  Fd fd(new int(::open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  if (*fd < 0) fail_errno("cannot open", path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(*fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot read", path);
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  return out;
}

void make_dirs(const std::string& dir) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) fail_errno("cannot create the folder", part);
  }
}

}  // namespace tandem
