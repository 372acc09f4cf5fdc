#include "cloud/pki/identities.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cloud/pki/mbed_support.h"
#include "core/error.h"

namespace tandem::pki {
namespace {

constexpr std::string_view kWhere = "pki";

std::string issued_path(const std::string& dir) { return dir + "/issued.tsv"; }
std::string revoked_path(const std::string& dir) { return dir + "/revoked.tsv"; }

// Holds STATE/pki.lock (flock) while a register file is read, changed and replaced.
class PkiLock {
 public:
  explicit PkiLock(const std::string& state_dir) {
    const std::string path = state_dir + "/pki.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0)
      fail(kWhere, cat("cannot lock ", path, ": ", std::strerror(errno)));
  }
  ~PkiLock() { ::close(fd_); }
  PkiLock(const PkiLock&) = delete;
  PkiLock& operator=(const PkiLock&) = delete;

 private:
  int fd_ = -1;
};

bool parse_i64(const std::string& s, int64_t& v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(line);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!line.empty() && line.back() == sep) out.emplace_back();
  return out;
}

// Lines of a register file, without the '#' header; a missing file has none.
std::vector<std::vector<std::string>> read_rows(const std::string& path, std::size_t fields) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    auto row = split(line, '\t');
    if (row.size() != fields)
      fail(kWhere, cat(path, " line ", number, ": expected ", fields, " tab-separated fields, found ", row.size(),
                       " (the file was edited by hand? restore it from the state folder's backup)"));
    rows.push_back(std::move(row));
  }
  return rows;
}

int64_t field_int(const std::string& path, const std::string& text) {
  int64_t v = 0;
  if (!parse_i64(text, v)) fail(kWhere, cat(path, ": '", text, "' is not a number of seconds"));
  return v;
}

std::vector<IssuedCertificate> read_issued(const std::string& dir) {
  std::vector<IssuedCertificate> out;
  const std::string path = issued_path(dir);
  for (auto& r : read_rows(path, 4))
    out.push_back({r[0], normalize_serial(r[1]), field_int(path, r[2]), field_int(path, r[3])});
  return out;
}

std::vector<Revocation> read_revoked(const std::string& dir) {
  std::vector<Revocation> out;
  const std::string path = revoked_path(dir);
  for (auto& r : read_rows(path, 3)) {
    Revocation rev{r[0], field_int(path, r[1]), {}};
    for (const std::string& s : split(r[2], ','))
      if (!s.empty()) rev.serials.push_back(normalize_serial(s));
    out.push_back(std::move(rev));
  }
  return out;
}

void write_issued(const std::string& dir, const std::vector<IssuedCertificate>& rows) {
  std::string text = "# client\tserial\tissued_at\tnot_after (unix seconds); written by tandem-cloud pki issue\n";
  for (const auto& c : rows) text += cat(c.client, "\t", c.serial, "\t", c.issued_at, "\t", c.not_after, "\n");
  write_atomically(issued_path(dir), text, 0600);
}

void write_revoked(const std::string& dir, const std::vector<Revocation>& rows) {
  std::string text = "# client\trevoked_at (unix seconds)\tserials; written by tandem-cloud pki revoke\n";
  for (const auto& r : rows) {
    std::string serials;
    for (const auto& s : r.serials) {
      if (!serials.empty()) serials += ",";
      serials += s;
    }
    text += cat(r.client, "\t", r.revoked_at, "\t", serials, "\n");
  }
  write_atomically(revoked_path(dir), text, 0600);
}

}  // namespace

std::string utc_text(int64_t t) {
  const std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string normalize_serial(const std::string& hex) {
  std::string out;
  for (char c : hex) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!std::isxdigit(static_cast<unsigned char>(l))) continue;  // ':' separators and the like
    if (out.empty() && l == '0') continue;
    out += l;
  }
  return out.empty() ? "0" : out;
}

std::vector<IssuedCertificate> issued_certificates(const std::string& state_dir) {
  PkiLock lock(state_dir);
  return read_issued(state_dir);
}

void record_issued(const std::string& state_dir, const IssuedCertificate& certificate) {
  PkiLock lock(state_dir);
  auto rows = read_issued(state_dir);
  rows.push_back(certificate);
  write_issued(state_dir, rows);
}

std::vector<Revocation> revocations(const std::string& state_dir) {
  PkiLock lock(state_dir);
  return read_revoked(state_dir);
}

Revocation revoke(const std::string& state_dir, const std::string& client, int64_t now) {
  PkiLock lock(state_dir);
  auto rows = read_revoked(state_dir);
  auto it = std::find_if(rows.begin(), rows.end(), [&](const Revocation& r) { return r.client == client; });
  if (it == rows.end()) it = rows.insert(rows.end(), Revocation{client, now, {}});
  it->revoked_at = now;  // again: tokens issued since the first revocation go too
  for (const IssuedCertificate& c : read_issued(state_dir))
    if (c.client == client && std::find(it->serials.begin(), it->serials.end(), c.serial) == it->serials.end())
      it->serials.push_back(c.serial);
  write_revoked(state_dir, rows);
  return *it;
}

RevocationList::RevocationList(std::string state_dir)
    : state_dir_(std::move(state_dir)), path_(revoked_path(state_dir_)) {
  reload_if_changed();
}

RevocationList::FileStamp RevocationList::stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_ino, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size)};
}

bool RevocationList::reload_if_changed() {
  // Both files: a certificate issued after a revocation must be known as such.
  const FileStamp revoked = stamp_of(path_), issued = stamp_of(issued_path(state_dir_));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (revoked == revoked_stamp_ && issued == issued_stamp_) return false;
  }
  std::vector<Revocation> rows;
  std::vector<IssuedCertificate> certs;
  {
    PkiLock lock(state_dir_);
    rows = read_revoked(state_dir_);
    certs = read_issued(state_dir_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  by_client_.clear();
  client_of_serial_.clear();
  issued_serials_.clear();
  for (auto& r : rows) {
    for (const auto& s : r.serials) client_of_serial_[s] = r.client;
    by_client_[r.client] = std::move(r);
  }
  for (const auto& c : certs) issued_serials_[c.serial] = c.client;
  revoked_stamp_ = revoked;
  issued_stamp_ = issued;
  ++generation_;
  return true;
}

uint64_t RevocationList::generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

std::string RevocationList::refuses_certificate(const std::string& common_name, const std::string& serial) {
  reload_if_changed();
  const std::string s = normalize_serial(serial);
  std::lock_guard<std::mutex> lock(mutex_);
  auto revoked = client_of_serial_.find(s);
  if (revoked == client_of_serial_.end()) {
    // A certificate with a revoked name that the register does not know (issued before it
    // existed): refused too. One issued since the revocation is in the register.
    const auto by_name = by_client_.find(common_name);
    if (by_name == by_client_.end() || issued_serials_.count(s)) return "";
    revoked = client_of_serial_.end();
  }
  const std::string client = revoked != client_of_serial_.end() ? revoked->second : common_name;
  const Revocation& r = by_client_.at(client);
  return cat("the certificate of '", common_name, "' (serial ", s, ") was revoked on ", utc_text(r.revoked_at),
             ": this edge may not connect; its operator must ask the cloud's operator for a new identity");
}

std::string RevocationList::refuses_token(const std::string& client, int64_t issued_at) {
  reload_if_changed();
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_client_.find(client);
  if (it == by_client_.end() || issued_at > it->second.revoked_at) return "";
  return cat("the enrolment token was issued to '", client, "' at ", utc_text(issued_at), ", before '", client,
             "' was revoked on ", utc_text(it->second.revoked_at), "; ask the cloud's operator for a new token");
}

std::string RevocationList::refuses_session(const std::string& client, int64_t since) {
  reload_if_changed();
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_client_.find(client);
  if (it == by_client_.end() || it->second.revoked_at < since) return "";
  return cat("the identity '", client, "' was revoked on ", utc_text(it->second.revoked_at),
             ": this session is closed; its operator must ask the cloud's operator for a new identity");
}

}  // namespace tandem::pki
