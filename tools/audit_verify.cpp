#include "tools/audit_verify.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/wire/egress_audit.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string tensor_text(const json& t) {
  std::string shape;
  for (const auto& d : t.at("shape")) {
    if (!shape.empty()) shape += ",";
    shape += std::to_string(d.get<int64_t>());
  }
  return cat(t.at("name").get<std::string>(), " ", t.at("dtype").get<std::string>(), " [", shape, "]");
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace

EgressReport verify_egress_log(std::istream& in) {
  EgressReport r;
  std::string prev = EgressAudit::genesis(), line;
  bool in_run = false;
  uint64_t run_messages = 0, run_bytes = 0, next_seq = 0;
  auto broken = [&](const std::string& why) {
    r.error = cat("line ", r.lines, ": ", why);
    return r;
  };
  while (std::getline(in, line)) {
    ++r.lines;
    std::string claimed, computed;
    if (!egress_line_hashes(line, claimed, computed)) return broken("not an egress log line (no hash at its end)");
    if (claimed != computed) return broken("its text does not give its hash: the line was edited");
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      return broken(cat("not JSON: ", e.what()));
    }
    try {
      if (j.at("prev").get<std::string>() != prev)
        return broken("its \"prev\" is not the hash of the line before: a line was removed, inserted or reordered");
      const std::string type = j.at("type").get<std::string>();
      const uint64_t seq = j.at("seq").get<uint64_t>();
      if (type == "run") {
        if (seq != 0) return broken("a run record with seq other than 0");
        if (in_run) r.notes.push_back(cat("run ", r.runs, " has no summary: the edge stopped without one (killed?)"));
        in_run = true;
        ++r.runs;
        run_messages = run_bytes = 0;
        r.clients.insert(j.at("client").get<std::string>());
      } else {
        if (!in_run) return broken("a record outside a run");
        if (seq != next_seq) return broken(cat("seq ", seq, " where ", next_seq, " was due"));
        if (type == "summary") {
          if (j.at("messages").get<uint64_t>() != run_messages || j.at("bytes").get<uint64_t>() != run_bytes)
            return broken(cat("the summary counts ", j.at("messages").get<uint64_t>(), " messages and ",
                              j.at("bytes").get<uint64_t>(), " bytes, the run's lines ", run_messages, " and ",
                              run_bytes));
          if (j.at("outcome").get<std::string>() == "interrupted")
            r.notes.push_back(cat("run ", r.runs, " was interrupted (its summary says so)"));
          in_run = false;
        } else {
          const uint64_t bytes = j.at("bytes").get<uint64_t>();
          EgressKind& k = r.kinds[type];
          ++k.messages;
          k.bytes += bytes;
          ++run_messages;
          run_bytes += bytes;
          ++r.messages;
          r.bytes += bytes;
          if (j.contains("tensors"))
            for (const auto& t : j.at("tensors")) k.tensors.insert(tensor_text(t));
          if (j.contains("labels")) k.labels += j.at("labels").get<uint64_t>();
          if (j.contains("mask")) k.mask_tokens += j.at("mask").get<uint64_t>();
        }
      }
      next_seq = seq + 1;
    } catch (const json::exception& e) {
      return broken(cat("a field is missing or of the wrong kind: ", e.what()));
    }
    prev = claimed;
  }
  if (in_run) r.notes.push_back(cat("run ", r.runs, " has no summary: the edge stopped without one, or the log was cut"));
  r.last_hash = prev;
  return r;
}

std::string egress_report_text(const std::string& path, const EgressReport& r) {
  if (!r.error.empty()) return cat("tandem audit: ", path, " does NOT verify: ", r.error, "\n");
  std::string clients;
  for (const auto& c : r.clients) { if (!clients.empty()) clients += ", "; clients += c; }
  std::string out = cat("tandem audit: ", path, " verifies: ", r.lines, " lines, ", r.runs, " run", r.runs == 1 ? "" : "s",
                        " (client ", clients.empty() ? "none" : clients, "), the chain intact; last hash ", r.last_hash,
                        "\nwhat left this edge, by kind:\n");
  for (const auto& [type, k] : r.kinds) {
    char head[96];
    std::snprintf(head, sizeof head, "  %-13s %8llu messages %12s", type.c_str(),
                  static_cast<unsigned long long>(k.messages), human_bytes(k.bytes).c_str());
    std::string what;
    for (const auto& t : k.tensors) { if (!what.empty()) what += "; "; what += t; }
    if (k.labels) what += cat(what.empty() ? "" : "; ", k.labels, " labels");
    if (k.mask_tokens) what += cat(what.empty() ? "" : "; ", k.mask_tokens, " mask tokens");
    out += cat(head, what.empty() ? "" : "   ", what, "\n");
  }
  char total[96];
  std::snprintf(total, sizeof total, "  %-13s %8llu messages %12s\n", "total",
                static_cast<unsigned long long>(r.messages), human_bytes(r.bytes).c_str());
  out += total;
  for (const auto& n : r.notes) out += cat("note: ", n, "\n");
  return out;
}

namespace {

int verify_command(const CliArgs& args) {
  const std::string path = args.required("LOG");
  std::ifstream in(path);
  if (!in) fail("audit", cat("cannot read ", path));
  const EgressReport r = verify_egress_log(in);
  std::fputs(egress_report_text(path, r).c_str(), stdout);
  if (!r.error.empty()) return 1;
  const std::string expect = args.str("expect-last", "");
  if (!expect.empty() && expect != r.last_hash) {
    std::printf("tandem audit: the last hash is %s, not the expected %s: lines were removed from the end, or this is "
                "another log\n",
                r.last_hash.c_str(), expect.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void declare_audit(Command& audit) {
  audit.command("verify", "check an edge's egress log and say what left the edge")
      .positional("LOG", "the log (tandem-edge --audit-log; default IDDIR/egress.jsonl)")
      .option("expect-last", "HASH", "the last hash the edge printed at the end of its run")
      .details("Checks every line's hash, the chain from line to line and each run's summary; prints what left the\n"
               "edge, by kind (messages, bytes, tensors with dtypes and shapes, labels). Exits 1 on any edited,\n"
               "removed, inserted or reordered line.")
      .run(verify_command);
}

}  // namespace tandem
