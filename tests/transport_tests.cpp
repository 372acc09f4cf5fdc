// Transport tests on loopback: TLS WebSockets with mutual TLS between an LwsEndpoint server
// and clients, large fragmented messages both ways, the size cap, and the connections that
// must be refused (another CA's certificate, no certificate, plain ws://).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "cloud/pki/pki.h"
#include "ports/lws/client_frame_audit.h"
#include "ports/lws/lws_endpoint.h"
#include "ports/lws/ws_frame.h"
#include "test_support.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Kind = EndpointEvent::Kind;

struct Pki {
  fs::path dir;
  TlsIdentity server, edge, foreign, anonymous;
  Pki() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-tls-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
    const auto r = pki::init((dir / "cloud").string());
    pki::issue((dir / "cloud").string(), "edge1", (dir / "edge1").string());
    pki::init((dir / "other").string());
    pki::issue((dir / "other").string(), "intruder", (dir / "intruder").string());
    server = {r.server_cert, r.server_key, r.ca_cert};
    edge = {(dir / "edge1/client.crt").string(), (dir / "edge1/client.key").string(), (dir / "edge1/ca.crt").string()};
    // The intruder trusts our server's CA but its own certificate comes from another CA.
    foreign = {(dir / "intruder/client.crt").string(), (dir / "intruder/client.key").string(), r.ca_cert};
    anonymous = {"", "", r.ca_cert};
  }
  ~Pki() { fs::remove_all(dir); }
};

Pki& pki_files() {
  static Pki p;
  return p;
}

// The next event of `kind`, skipping none: fails the test on timeout or another kind.
EndpointEvent expect_event(LwsEndpoint& e, Kind kind, std::chrono::milliseconds timeout = 10s) {
  EndpointEvent ev;
  EXPECT_TRUE(e.next(ev, timeout)) << "no event within the timeout";
  EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(kind)) << "event text: " << ev.text;
  return ev;
}

std::vector<uint8_t> pattern(std::size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

// The client's own frames (RFC 6455 5.2): header, length forms, mask key, masked payload.
TEST(ClientFrame, HeaderLengthAndMaskFollowRfc6455) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{125}, std::size_t{126}, std::size_t{4099},
                              std::size_t{65535}, std::size_t{65536}, std::size_t{70001}}) {
    std::vector<uint8_t> payload(n), frame(kMaxClientFrameHeader + n);
    for (std::size_t i = 0; i < n; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 3);
    for (const bool first : {true, false})
      for (const bool last : {true, false}) {
        const std::size_t len = write_client_frame(frame.data(), payload.data(), n, first, last, 0xa1b2c3d4u);
        EXPECT_EQ(frame[0], (last ? 0x80 : 0x00) | (first ? 0x2 : 0x0)) << n;
        ASSERT_EQ(frame[1] & 0x80, 0x80) << "client frames are masked";
        std::size_t h = 2, got = frame[1] & 0x7f;
        if (got == 126) {
          got = std::size_t{frame[2]} << 8 | frame[3];
          h = 4;
        } else if (got == 127) {
          got = 0;
          for (int i = 0; i < 8; ++i) got = got << 8 | frame[2 + i];
          h = 10;
        }
        EXPECT_EQ(got, n);
        EXPECT_EQ(h, n < 126 ? 2u : n < 65536 ? 4u : 10u) << "shortest length form, n = " << n;
        const uint8_t key[4] = {frame[h], frame[h + 1], frame[h + 2], frame[h + 3]};
        EXPECT_EQ(key[0], 0xd4);
        EXPECT_EQ(key[3], 0xa1);
        ASSERT_EQ(len, h + 4 + n);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(frame[h + 4 + i] ^ key[i % 4], payload[i]) << "byte " << i << " of " << n;
      }
  }
}

// The server's audit of a client's stream: requests, the upgrade, then frames of every length
// form, masked (fine) and then one unmasked (the violation), fed whole and a byte at a time.
TEST(ClientFrameAudit, FollowsFramesAndCatchesTheFirstUnmaskedOne) {
  const std::string get = "GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string upgrade = "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n\r\n";
  std::vector<uint8_t> stream(get.begin(), get.end());
  stream.insert(stream.end(), upgrade.begin(), upgrade.end());
  for (const std::size_t n : {std::size_t{0}, std::size_t{125}, std::size_t{126}, std::size_t{70001}}) {
    std::vector<uint8_t> payload(n, 0x55), frame(kMaxClientFrameHeader + n);
    frame.resize(write_client_frame(frame.data(), payload.data(), n, true, true, 0x01020304u));
    stream.insert(stream.end(), frame.begin(), frame.end());
  }
  const std::size_t masked_end = stream.size();
  const uint8_t unmasked[] = {0x82, 0x03, 'a', 'b', 'c'};
  stream.insert(stream.end(), std::begin(unmasked), std::end(unmasked));
  for (const bool bytewise : {false, true}) {
    ClientFrameAudit audit;
    if (bytewise) {
      for (std::size_t i = 0; i < masked_end; ++i) audit.feed(&stream[i], 1);
    } else {
      audit.feed(stream.data(), masked_end);
    }
    EXPECT_EQ(audit.violation(), "") << "masked frames after an upgrade are fine";
    audit.feed(stream.data() + masked_end, stream.size() - masked_end);
    EXPECT_EQ(audit.violation(),
              "a client frame without a mask (RFC 6455 section 5.1: every client frame is masked)");
  }
  ClientFrameAudit plain_http;  // without an upgrade, nothing is read as a frame
  plain_http.feed(reinterpret_cast<const uint8_t*>(get.data()), get.size());
  plain_http.feed(unmasked, sizeof unmasked);
  EXPECT_EQ(plain_http.violation(), "");
}

TEST(Transport, MutualTlsCarriesLargeMessagesBothWays) {
  auto server = LwsEndpoint::listen("127.0.0.1", 0, pki_files().server);
  ASSERT_GT(server->port(), 0);
  auto client = LwsEndpoint::connect("localhost", server->port(), pki_files().edge);
  const EndpointEvent hello = expect_event(*server, Kind::Connected);
  EXPECT_EQ(hello.text, "edge1");  // the peer certificate's CN
  expect_event(*client, Kind::Connected);

  const auto up = pattern(3 * 1024 * 1024 + 17, 1);  // many 64 KiB fragments
  client->send(0, up);
  client->send(0, pattern(10, 2));
  EndpointEvent got = expect_event(*server, Kind::Message);
  ASSERT_EQ(got.frame.size(), up.size());
  EXPECT_EQ(std::memcmp(got.frame.data(), up.data(), up.size()), 0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.frame.data()) % 64, 0u);
  EXPECT_EQ(expect_event(*server, Kind::Message).frame.size(), 10u);  // order kept

  const auto down = pattern(1024 * 1024 + 5, 3);
  server->send(hello.connection, down);
  got = expect_event(*client, Kind::Message);
  ASSERT_EQ(got.frame.size(), down.size());
  EXPECT_EQ(std::memcmp(got.frame.data(), down.data(), down.size()), 0);

  server->send(hello.connection, pattern(4, 4), /*close_after=*/true);
  EXPECT_EQ(expect_event(*client, Kind::Message).frame.size(), 4u);
  expect_event(*client, Kind::Closed);
  expect_event(*server, Kind::Closed);
}

TEST(Transport, OverTheSizeCapGetsAnErrorAndTheServerGoesOn) {
  EndpointOptions small;
  small.max_message_bytes = 1 << 20;
  auto server = LwsEndpoint::listen("127.0.0.1", 0, pki_files().server, small);
  auto client = LwsEndpoint::connect("localhost", server->port(), pki_files().edge);
  expect_event(*server, Kind::Connected);
  expect_event(*client, Kind::Connected);
  client->send(0, pattern(2 << 20, 5));
  EndpointEvent reply = expect_event(*client, Kind::Message);
  WireError err;
  const wire::Message* m = verify_frame(reply.frame, kDefaultMaxMessageBytes, err);
  ASSERT_NE(m, nullptr) << err.text;
  ASSERT_EQ(m->payload_type(), wire::Payload::Error);
  EXPECT_EQ(m->payload_as_Error()->code(), wire::ErrorCode::TooLarge);
  EXPECT_EQ(m->payload_as_Error()->text()->str(), "message exceeds the limit of 1048576 bytes");
  expect_event(*client, Kind::Closed);
  expect_event(*server, Kind::Closed);

  auto second = LwsEndpoint::connect("localhost", server->port(), pki_files().edge);
  expect_event(*server, Kind::Connected);
  expect_event(*second, Kind::Connected);
}

void expect_refused(const TlsIdentity& who, const EndpointOptions& options = {}) {
  auto server = LwsEndpoint::listen("127.0.0.1", 0, pki_files().server, options);
  auto client = LwsEndpoint::connect("localhost", server->port(), who);
  EndpointEvent ev;
  ASSERT_TRUE(client->next(ev, 10s));
  EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Closed)) << ev.text;
  EXPECT_FALSE(server->next(ev, 200ms) && ev.kind == Kind::Connected) << "the server accepted " << ev.text;
  // And it keeps serving a proper edge.
  auto good = LwsEndpoint::connect("localhost", server->port(), pki_files().edge);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "edge1");
}

TEST(Transport, ClientCertificateFromAnotherCaIsRefused) { expect_refused(pki_files().foreign); }

TEST(Transport, NoClientCertificateIsRefused) { expect_refused(pki_files().anonymous); }

// For browsers (enrolment tokens): a peer without a certificate gets in with an empty CN for
// the application to authenticate, but a certificate from another CA is still refused.
EndpointOptions certificate_optional() {
  EndpointOptions o;
  o.client_certificate_optional = true;
  return o;
}

TEST(Transport, OptionalClientCertificateLetsAnonymousPeersInWithoutACommonName) {
  auto server = LwsEndpoint::listen("127.0.0.1", 0, pki_files().server, certificate_optional());
  auto anonymous = LwsEndpoint::connect("localhost", server->port(), pki_files().anonymous);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "");
  expect_event(*anonymous, Kind::Connected);
  auto edge = LwsEndpoint::connect("localhost", server->port(), pki_files().edge);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "edge1");
}

TEST(Transport, OptionalClientCertificateStillRefusesAnotherCa) {
  expect_refused(pki_files().foreign, certificate_optional());
}

TEST(Transport, PlainWebSocketIsRefused) {
  auto server = LwsEndpoint::listen("127.0.0.1", 0, pki_files().server);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string upgrade =
      "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: tandem.v1\r\n"
      "Sec-WebSocket-Version: 13\r\n\r\n";
  ASSERT_EQ(::write(fd, upgrade.data(), upgrade.size()), static_cast<ssize_t>(upgrade.size()));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  const std::string answer = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  EXPECT_EQ(answer.find("101 Switching Protocols"), std::string::npos) << answer;
  EndpointEvent ev;
  EXPECT_FALSE(server->next(ev, 200ms) && ev.kind == Kind::Connected);
}

}  // namespace
}  // namespace tandem::test
