#include "edge/agent/cloud_link.h"

#include <chrono>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {
constexpr auto kReplyTimeout = std::chrono::seconds(120);
}

void check_identity_folder(const std::string& identity_dir, bool without_certificate) {
  const std::string issue = cat("on the cloud, `tandem-cloud pki issue --state-dir STATE --client NAME --out ", identity_dir,
                                "` makes one; copy that folder here");
  namespace fs = std::filesystem;
  if (!fs::exists(identity_dir))
    fail("edge", cat("--identity ", identity_dir, ": no such folder. An edge's identity folder holds client.crt, "
                     "client.key and ca.crt: ", issue));
  if (!fs::is_directory(identity_dir))
    fail("edge", cat("--identity ", identity_dir, " is a file: give the folder that holds client.crt, client.key and "
                     "ca.crt (", issue, ")"));
  std::vector<std::string> missing;
  for (const char* name : {"client.crt", "client.key", "ca.crt"})
    if ((!without_certificate || std::string(name) == "ca.crt") && !fs::exists(cat(identity_dir, "/", name)))
      missing.push_back(name);
  if (missing.empty()) return;
  std::string names;
  for (const std::string& m : missing) names += cat(names.empty() ? "" : ", ", identity_dir, "/", m);
  fail("edge", cat(names, missing.size() == 1 ? " is" : " are", " missing: issue an identity with `tandem-cloud pki issue "
                   "--state-dir STATE --client NAME --out ", identity_dir, "` on the cloud and copy the folder here",
                   without_certificate ? " (with --token, only ca.crt is needed)"
                                       : ", or connect with --token from `tandem-cloud pki token`"));
}

CloudLink::CloudLink(const std::string& host, int port, const std::string& identity_dir, bool without_certificate)
    : host_(host), port_(port) {
  TlsIdentity id{identity_dir + "/client.crt", identity_dir + "/client.key", identity_dir + "/ca.crt"};
  if (without_certificate) id.cert = id.key = "";
  link_ = WssClient::connect(host, port, id);
  EndpointEvent ev;
  if (!link_->next(ev, std::chrono::seconds(30)) || ev.kind != EndpointEvent::Kind::Connected) {
    if (ev.text.find("Connection refused") != std::string::npos)
      fail("edge", cat("cannot connect to wss://", host, ":", port, ": nothing listens there (connection refused): start "
                       "the cloud (`tandem-cloud serve`, which prints the address it listens on) or check --cloud's "
                       "host and port"));
    fail("edge", cat("cannot connect to wss://", host, ":", port, ": ", ev.text.empty() ? "no answer within 30 s" : ev.text,
                     " (is tandem-cloud serve running there, and was this identity issued by its CA?)"));
  }
}

void CloudLink::send(std::span<const uint8_t> bytes) {
  up_ += bytes.size();
  link_->send(0, bytes);
}

Frame CloudLink::await(const char* awaiting) {
  const auto t0 = std::chrono::steady_clock::now();
  EndpointEvent ev;
  for (;;) {
    if (!link_->next(ev, kReplyTimeout)) fail("edge", cat("no ", awaiting, " from the cloud within 120 s"));
    if (ev.kind == EndpointEvent::Kind::Message) break;
    if (ev.kind == EndpointEvent::Kind::Closed)
      fail("edge", cat("the cloud closed the connection while this edge waited for ", awaiting, " (", ev.text, ")"));
  }
  idle_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  down_ += ev.frame.size();
  return std::move(ev.frame);
}

}  // namespace tandem
