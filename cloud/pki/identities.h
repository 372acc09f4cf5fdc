// The register of the identities a cloud's CA issued and the revocation list: which client
// holds which certificate serials, until when, and which were revoked (files in the state dir).
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tandem::pki {

struct IssuedCertificate {
  std::string client, serial;  // serial: lowercase hex, no leading zeros
  int64_t issued_at = 0, not_after = 0;
};

struct Revocation {
  std::string client;
  int64_t revoked_at = 0;
  std::vector<std::string> serials;  // every certificate issued to the client until then
};

// STATE/issued.tsv: one line per certificate `pki issue` made. Replaced atomically under
// STATE/pki.lock, like revoked.tsv, so two commands at once lose nothing.
std::vector<IssuedCertificate> issued_certificates(const std::string& state_dir);
void record_issued(const std::string& state_dir, const IssuedCertificate& certificate);

// STATE/revoked.tsv: one line per revoked client. Revoking a client refuses every certificate
// issued to it so far (by serial; one with its name whose serial the register does not know,
// too) and every enrolment token for it issued until now. An identity issued afterwards works.
std::vector<Revocation> revocations(const std::string& state_dir);
Revocation revoke(const std::string& state_dir, const std::string& client, int64_t now = std::time(nullptr));

// "2026-11-23 10:05:00 UTC".
std::string utc_text(int64_t t);
// Lowercase hex without leading zeros ("0" for zero): how serials are compared and shown.
std::string normalize_serial(const std::string& hex);

// The revocation list as a running service reads it: asked at every connection and token,
// each question first rereading the files if they changed (a `pki revoke` a moment ago
// counts). Thread-safe.
class RevocationList {
 public:
  explicit RevocationList(std::string state_dir);
  // Reads the files again if they were replaced or changed since; true when they were.
  bool reload_if_changed();
  // How many times the files were read: a service compares it to close live sessions once
  // for each change, whichever question reread them.
  uint64_t generation() const;
  // "" when a connection with this certificate (CN, serial) may go on; otherwise why not.
  std::string refuses_certificate(const std::string& common_name, const std::string& serial);
  // "" when an enrolment token for `client` issued at `issued_at` may be used.
  std::string refuses_token(const std::string& client, int64_t issued_at);
  // "" unless `client` was revoked at or after `since` (a live token session started then).
  std::string refuses_session(const std::string& client, int64_t since);

 private:
  std::string state_dir_, path_;
  mutable std::mutex mutex_;
  std::map<std::string, Revocation> by_client_;
  std::map<std::string, std::string> client_of_serial_;  // revoked serials
  std::map<std::string, std::string> issued_serials_;    // serial -> client, from the register
  struct FileStamp {  // tells a replaced or changed file
    ino_t inode = 0;
    int64_t mtime_ns = -1, size = -1;
    bool operator==(const FileStamp&) const = default;
  };
  static FileStamp stamp_of(const std::string& path);
  FileStamp revoked_stamp_, issued_stamp_;  // guarded by mutex_
  uint64_t generation_ = 0;
};

}  // namespace tandem::pki
