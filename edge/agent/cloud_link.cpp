#include "edge/agent/cloud_link.h"

#include <chrono>
#include <filesystem>

#include "core/error.h"

namespace tandem {
namespace {
constexpr auto kReplyTimeout = std::chrono::seconds(120);
}

CloudLink::CloudLink(const std::string& host, int port, const std::string& identity_dir, bool without_certificate) {
  TlsIdentity id{identity_dir + "/client.crt", identity_dir + "/client.key", identity_dir + "/ca.crt"};
  if (without_certificate) id.cert = id.key = "";
  for (const std::string& file : {id.ca, id.cert, id.key})
    if (!file.empty() && !std::filesystem::exists(file))
      fail("edge", cat(file, " is missing: issue an identity with `tandem-cloud pki issue --client NAME --out ",
                       identity_dir, "`", without_certificate ? "" : ", or connect with --token from `tandem-cloud pki token`"));
  link_ = WssClient::connect(host, port, id);
  EndpointEvent ev;
  if (!link_->next(ev, std::chrono::seconds(30)) || ev.kind != EndpointEvent::Kind::Connected)
    fail("edge", cat("cannot connect to wss://", host, ":", port, ": ", ev.text.empty() ? "no answer within 30 s" : ev.text,
                     " (is tandem-cloud serve running, and was this identity issued by its CA?)"));
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
