// The native edge's egress log on disk (core/wire/egress_audit.h): one line appended and
// flushed for every message before it is sent, the chain continued across runs in one file.
#pragma once

#include <cstdio>
#include <string>

#include "core/wire/egress_audit.h"

namespace tandem {

class EgressLogFile {
 public:
  // Opens (or creates, 0600) the log; a run appends to what it holds. Throws Error naming
  // the path when it cannot.
  explicit EgressLogFile(const std::string& path);
  // A run that ends without finish() (an exception) still gets its summary, "interrupted".
  ~EgressLogFile();
  EgressLogFile(const EgressLogFile&) = delete;
  EgressLogFile& operator=(const EgressLogFile&) = delete;

  EgressAudit& audit() { return audit_; }
  const std::string& path() const { return path_; }
  // Appends the run's summary and syncs the file; returns the chain's last hash.
  std::string finish(const std::string& outcome);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  EgressAudit audit_;
  bool finished_ = false;
};

}  // namespace tandem
