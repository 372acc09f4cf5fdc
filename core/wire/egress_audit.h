// The edge's egress audit: a hash-chained JSON line for every message the edge sends (type,
// step, tensor names, shapes, dtypes, bytes, the SHA-256 of each payload), a run's summary.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>

namespace tandem {
namespace wire {
struct TensorMsg;
}

// Each line is a JSON object whose last member is "hash": the SHA-256 (hex) of the line's text
// before `,"hash":"`. Its "prev" member is the previous line's hash (64 zeros on a log's first
// line), so an edited, removed, inserted or reordered line breaks the chain. A log may hold
// several runs: each starts with a "run" record and ends with a "summary" record.
class EgressAudit {
 public:
  using Sink = std::function<void(const std::string& line)>;  // the line, without its newline
  // SHA-256 of a payload; core's portable one by default, a native edge passes OpenSSL's
  // (6x faster with the CPU's SHA instructions: the audit then costs the edge a few percent).
  using Hasher = std::function<std::array<uint8_t, 32>(std::span<const uint8_t>)>;
  static std::string genesis() { return std::string(64, '0'); }

  // `prev`: the hash of the log's last line when this run continues a log.
  explicit EgressAudit(Sink sink, std::string prev = genesis(), Hasher hasher = nullptr);

  void begin_run(const std::string& client, const std::string& model, const std::string& cut,
                 const std::array<uint8_t, 32>& model_hash);
  // One message about to leave (a tandem wire message; anything else is logged as "unknown").
  void record(std::span<const uint8_t> message);
  // The run's summary record; returns the chain's last hash, to keep elsewhere as an anchor.
  std::string finish(const std::string& outcome);

  const std::string& last_hash() const { return prev_; }
  uint64_t messages() const { return messages_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void append(std::string body);  // body: the members before "prev" and "hash"
  std::string payload_hash(std::span<const uint8_t> bytes) const;
  std::string tensor_json(const wire::TensorMsg* t) const;
  std::string labels_json(std::span<const int32_t> labels) const;
  std::string mask_json(const flatbuffers::Vector<uint8_t>* mask) const;  // "" without one
  Sink sink_;
  Hasher hasher_;
  std::string prev_;
  uint64_t seq_ = 0, messages_ = 0, bytes_ = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type_;  // messages, bytes
  bool open_ = false;
};

// The hash a line claims and the one its text gives; false when it has no "hash" member.
bool egress_line_hashes(const std::string& line, std::string& claimed, std::string& computed);

// JSON string contents for `s` (quotes, backslashes and control characters escaped).
std::string json_escape(const std::string& s);

}  // namespace tandem
