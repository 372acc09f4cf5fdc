// `tandem audit verify LOG`: checks an edge's egress log (core/wire/egress_audit.h) line by
// line (every line's own hash, the chain, the runs' counts) and says what left, by kind.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/command_line.h"

namespace tandem {

struct EgressKind {
  uint64_t messages = 0, bytes = 0, labels = 0, mask_tokens = 0;  // mask: one byte a token
  std::set<std::string> tensors;  // "name dtype [shape]"
};

struct EgressReport {
  std::string error;  // "" when the log verifies; else the first broken line and why
  uint64_t lines = 0, runs = 0;
  std::vector<std::string> notes;  // runs without a summary (interrupted or killed)
  std::set<std::string> clients;
  std::map<std::string, EgressKind> kinds;
  uint64_t messages = 0, bytes = 0;
  std::string last_hash;
};

EgressReport verify_egress_log(std::istream& in);
std::string egress_report_text(const std::string& path, const EgressReport& report);

// `tandem audit`: its command verify.
void declare_audit(Command& audit);

}  // namespace tandem
