// Transport tests on loopback: TLS WebSockets with mutual TLS between the cloud's server
// (LwsEndpoint) and the edge's client (WssClient), large fragmented messages both ways, the
// size cap, the connections that must be refused (another CA's certificate, no certificate,
// plain ws://, a server certificate for another name), and a broken server's frames.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>
#include <thread>

#include "cloud/pki/pki.h"
#include "ports/lws/client_frame_audit.h"
#include "ports/lws/lws_endpoint.h"
#include "ports/tls/wss_client.h"
#include "ports/tls/ws_frame.h"
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

// The server under test, on TANDEM_TEST_IO_THREADS service threads when that is set and the
// options ask for one (ctest's transport.tls_io_threads runs every case so: the acceptor's
// path, each socket adopted by a service thread).
std::unique_ptr<LwsEndpoint> listen_server(EndpointOptions options = {}, const std::string& host = "127.0.0.1") {
  if (const char* n = std::getenv("TANDEM_TEST_IO_THREADS"); n != nullptr && options.io_threads == 1)
    options.io_threads = std::atoi(n);
  return LwsEndpoint::listen(host, 0, pki_files().server, options);
}

// The next event of `kind`, skipping none: fails the test on timeout or another kind.
template <class Endpoint>
EndpointEvent expect_event(Endpoint& e, Kind kind, std::chrono::milliseconds timeout = 10s) {
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
  auto server = listen_server();
  ASSERT_GT(server->port(), 0);
  auto client = WssClient::connect("localhost", server->port(), pki_files().edge);
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

// The server's TLS on three service threads (a context each on one port): the connections
// spread over them, each keeps its messages' order both ways, and the connection bound counts
// them all together.
TEST(Transport, ConnectionsSpreadOverIoThreadsEachInOrder) {
  EndpointOptions o;
  o.io_threads = 3;
  o.max_connections = 12;
  auto server = listen_server(o);
  ASSERT_EQ(server->io_threads(), 3u);
  constexpr int kClients = 12;
  std::vector<std::unique_ptr<WssClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(WssClient::connect("localhost", server->port(), pki_files().edge));
    expect_event(*clients.back(), Kind::Connected);
    expect_event(*server, Kind::Connected);
  }
  // Each client says which it is by its first message's size, then sends a large one.
  for (int i = 0; i < kClients; ++i) {
    clients[i]->send(0, pattern(10 + i, static_cast<uint8_t>(i)));
    clients[i]->send(0, pattern(300 * 1024 + i, static_cast<uint8_t>(100 + i)));
  }
  std::map<uint64_t, int> client_of;
  std::map<uint64_t, int> received;
  for (int m = 0; m < 2 * kClients; ++m) {
    const EndpointEvent ev = expect_event(*server, Kind::Message);
    const int seen = received[ev.connection]++;
    if (seen == 0) {
      ASSERT_GE(ev.frame.size(), 10u);
      ASSERT_LT(ev.frame.size(), 10u + kClients);
      client_of[ev.connection] = static_cast<int>(ev.frame.size() - 10);
    } else {
      ASSERT_EQ(seen, 1) << "a third message from one connection";
      const int i = client_of.at(ev.connection);
      const auto want = pattern(300 * 1024 + i, static_cast<uint8_t>(100 + i));
      ASSERT_EQ(ev.frame.size(), want.size()) << "connection " << ev.connection << "'s messages out of order";
      EXPECT_EQ(std::memcmp(ev.frame.data(), want.data(), want.size()), 0);
    }
  }
  ASSERT_EQ(client_of.size(), static_cast<std::size_t>(kClients));
  for (const auto& [connection, i] : client_of) {
    server->send(connection, pattern(200 * 1024 + i, static_cast<uint8_t>(i)));
    server->send(connection, pattern(20 + i, static_cast<uint8_t>(i)));
  }
  for (int i = 0; i < kClients; ++i) {
    EndpointEvent ev = expect_event(*clients[i], Kind::Message);
    const auto want = pattern(200 * 1024 + i, static_cast<uint8_t>(i));
    ASSERT_EQ(ev.frame.size(), want.size());
    EXPECT_EQ(std::memcmp(ev.frame.data(), want.data(), want.size()), 0);
    EXPECT_EQ(expect_event(*clients[i], Kind::Message).frame.size(), static_cast<std::size_t>(20 + i));
  }
  const std::vector<uint64_t> spread = server->connections_per_io_thread();
  ASSERT_EQ(spread.size(), 3u);
  EXPECT_EQ(spread[0] + spread[1] + spread[2], static_cast<uint64_t>(kClients));
  EXPECT_GE(std::count_if(spread.begin(), spread.end(), [](uint64_t n) { return n > 0; }), 2)
      << spread[0] << ", " << spread[1] << ", " << spread[2] << " connections a thread";

  // The thirteenth connection, whichever thread takes it, is over the bound of all of them.
  auto extra = WssClient::connect("localhost", server->port(), pki_files().edge);
  expect_event(*extra, Kind::Connected);
  const EndpointEvent busy = expect_event(*extra, Kind::Message);
  WireError err;
  const wire::Message* m = verify_frame(busy.frame, kDefaultMaxMessageBytes, err);
  ASSERT_NE(m, nullptr) << err.text;
  ASSERT_EQ(m->payload_type(), wire::Payload::Error);
  EXPECT_EQ(m->payload_as_Error()->code(), wire::ErrorCode::Busy);
  expect_event(*extra, Kind::Closed);
  EXPECT_EQ(server->refused_connections(), 1u);
  clients.clear();
  for (int i = 0; i < kClients; ++i) expect_event(*server, Kind::Closed);

  // Every socket handed to a thread counts until it is gone, WebSocket or not (one refused in
  // the TLS handshake too), so the acceptor's measure of load comes back to 0.
  {
    auto intruder = WssClient::connect("localhost", server->port(), pki_files().foreign);
    EndpointEvent ev;
    ASSERT_TRUE(intruder->next(ev, 10s));
    EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Closed));
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::vector<std::size_t> left = server->sockets_per_io_thread();
  while (left != std::vector<std::size_t>(3, 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    left = server->sockets_per_io_thread();
  }
  EXPECT_EQ(left, std::vector<std::size_t>(3, 0)) << "sockets still counted after every one closed";
}

TEST(Transport, OverTheSizeCapGetsAnErrorAndTheServerGoesOn) {
  EndpointOptions small;
  small.max_message_bytes = 1 << 20;
  auto server = listen_server(small);
  auto client = WssClient::connect("localhost", server->port(), pki_files().edge);
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

  auto second = WssClient::connect("localhost", server->port(), pki_files().edge);
  expect_event(*server, Kind::Connected);
  expect_event(*second, Kind::Connected);
}

void expect_refused(const TlsIdentity& who, const EndpointOptions& options = {}) {
  auto server = listen_server(options);
  auto client = WssClient::connect("localhost", server->port(), who);
  EndpointEvent ev;
  ASSERT_TRUE(client->next(ev, 10s));
  EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Closed)) << ev.text;
  EXPECT_FALSE(server->next(ev, 200ms) && ev.kind == Kind::Connected) << "the server accepted " << ev.text;
  // And it keeps serving a proper edge.
  auto good = WssClient::connect("localhost", server->port(), pki_files().edge);
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
  auto server = listen_server(certificate_optional());
  auto anonymous = WssClient::connect("localhost", server->port(), pki_files().anonymous);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "");
  expect_event(*anonymous, Kind::Connected);
  auto edge = WssClient::connect("localhost", server->port(), pki_files().edge);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "edge1");
}

TEST(Transport, OptionalClientCertificateStillRefusesAnotherCa) {
  expect_refused(pki_files().foreign, certificate_optional());
}

TEST(Transport, PlainWebSocketIsRefused) {
  auto server = listen_server();
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

// The server's frame headers as the edge's client reads them (RFC 6455 5.2, 5.1, 5.5).
TEST(ClientFrame, ServerHeadersAreReadAndChecked) {
  ServerFrameHeader h;
  std::string error;
  const uint8_t small[] = {0x82, 0x05};
  ASSERT_TRUE(read_server_frame_header(small, 2, h, error));
  EXPECT_TRUE(h.fin);
  EXPECT_EQ(h.opcode, ws_opcode::kBinary);
  EXPECT_EQ(h.length, 5u);
  EXPECT_EQ(h.size, 2u);
  const uint8_t medium[] = {0x02, 126, 0x01, 0x00};
  EXPECT_FALSE(read_server_frame_header(medium, 3, h, error));  // more bytes needed
  EXPECT_EQ(error, "");
  ASSERT_TRUE(read_server_frame_header(medium, 4, h, error));
  EXPECT_FALSE(h.fin);
  EXPECT_EQ(h.length, 256u);
  EXPECT_EQ(h.size, 4u);
  const uint8_t large[] = {0x80, 127, 0, 0, 0, 0, 0, 1, 0, 0};
  ASSERT_TRUE(read_server_frame_header(large, 10, h, error));
  EXPECT_EQ(h.opcode, ws_opcode::kContinuation);
  EXPECT_EQ(h.length, 65536u);
  EXPECT_EQ(h.size, 10u);

  const auto broken = [](std::initializer_list<uint8_t> bytes) {
    const std::vector<uint8_t> v(bytes);
    ServerFrameHeader ignored;
    std::string why;
    EXPECT_FALSE(read_server_frame_header(v.data(), v.size(), ignored, why));
    return why;
  };
  EXPECT_EQ(broken({0x82, 0x85, 1, 2, 3, 4}), "a masked frame from the server (RFC 6455 section 5.1: a server never masks)");
  EXPECT_EQ(broken({0xC2, 0x00}), "a frame with reserved bits set (no extension was agreed)");
  EXPECT_EQ(broken({0x83, 0x00}), "a frame with the reserved opcode 3");
  EXPECT_EQ(broken({0x8B, 0x00}), "a frame with the reserved opcode 11");
  EXPECT_EQ(broken({0x09, 0x00}), "a fragmented or long control frame (RFC 6455 section 5.5)");
  EXPECT_EQ(broken({0x89, 126, 0, 200}), "a fragmented or long control frame (RFC 6455 section 5.5)");
  EXPECT_EQ(broken({0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}), "a frame length with its top bit set");
}

// A TLS server that answers the WebSocket upgrade itself and then sends `then` as it is: what
// a broken or hostile server could send the edge's client.
class RawTlsServer {
 public:
  explicit RawTlsServer(std::vector<uint8_t> then, bool right_accept = true) : then_(std::move(then)) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate_chain_file(ctx_, pki_files().server.cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx_, pki_files().server.key.c_str(), SSL_FILETYPE_PEM);
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listen_fd_, 1), 0);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, right_accept] { serve(right_accept); });
  }
  ~RawTlsServer() {
    thread_.join();
    ::close(listen_fd_);
    SSL_CTX_free(ctx_);
  }
  int port() const { return port_; }

 private:
  void serve(bool right_accept) {
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL* ssl = SSL_new(ctx_);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const int n = SSL_read(ssl, buf, sizeof buf);
        if (n <= 0) break;
        request.append(buf, static_cast<std::size_t>(n));
      }
      const std::size_t at = request.find("Sec-WebSocket-Key: ") + 19;
      std::string key = request.substr(at, request.find("\r\n", at) - at) + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
      if (!right_accept) key += "x";
      unsigned char digest[SHA_DIGEST_LENGTH], accept[64] = {};
      SHA1(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
      EVP_EncodeBlock(accept, digest, sizeof digest);
      std::string reply = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Protocol: tandem.v1\r\nSec-WebSocket-Accept: ";
      reply += reinterpret_cast<const char*>(accept);
      reply += "\r\n\r\n";
      reply.append(then_.begin(), then_.end());
      SSL_write(ssl, reply.data(), static_cast<int>(reply.size()));
      while (SSL_read(ssl, buf, sizeof buf) > 0) {  // until the client closes (or 5 s)
      }
    }
    SSL_free(ssl);
    ::close(fd);
  }
  std::vector<uint8_t> then_;
  SSL_CTX* ctx_ = nullptr;
  int listen_fd_ = -1, port_ = 0;
  std::thread thread_;
};

// What the client reports (the Closed event's text) after the server sent `frames`, and
// the sizes of the messages it delivered before.
std::string client_verdict(std::vector<uint8_t> frames, std::vector<std::size_t>* messages = nullptr,
                           bool right_accept = true, EndpointOptions options = {}) {
  RawTlsServer server(std::move(frames), right_accept);
  auto client = WssClient::connect("localhost", server.port(), pki_files().edge, options);
  EndpointEvent ev;
  while (client->next(ev, 10s)) {
    if (ev.kind == Kind::Closed) return ev.text;
    if (ev.kind == Kind::Message && messages) messages->push_back(ev.frame.size());
  }
  return "no Closed within 10 s";
}

TEST(Transport, TheClientRefusesWhatABrokenServerSends) {
  EXPECT_EQ(client_verdict({}, nullptr, /*right_accept=*/false),
            "connection closed during the handshake: the server's Sec-WebSocket-Accept does not match the key");
  EXPECT_EQ(client_verdict({0x82, 0x83, 1, 2, 3, 4, 'a', 'b', 'c'}),
            "connection closed: the server broke the WebSocket protocol: a masked frame from the server (RFC 6455 "
            "section 5.1: a server never masks)");
  EXPECT_EQ(client_verdict({0x81, 0x01, 'a'}),
            "connection closed: the server sent a text frame (tandem.v1 is binary frames only)");
  EXPECT_EQ(client_verdict({0x80, 0x01, 'a'}), "connection closed: the server continued a message it never began");
  EXPECT_EQ(client_verdict({0x02, 0x01, 'a', 0x82, 0x01, 'b'}),
            "connection closed: the server began a message inside another");
  EndpointOptions small;
  small.max_message_bytes = 1000;
  EXPECT_EQ(client_verdict({0x82, 126, 0x07, 0xD0}, nullptr, true, small),  // 2000 announced
            "connection closed: a message from the server exceeds the limit of 1000 bytes");
  // A message in three fragments with a ping between them, then a close with a reason: the
  // message arrives whole, and the reason is reported.
  std::vector<uint8_t> frames = {0x02, 0x02, 'a', 'b', 0x89, 0x01, 'p', 0x00, 0x01, 'c', 0x80, 0x00};
  frames.insert(frames.end(), {0x82, 0x00});  // an empty message
  frames.insert(frames.end(), {0x88, 0x05, 0x03, 0xE8, 'b', 'y', 'e'});
  std::vector<std::size_t> messages;
  EXPECT_EQ(client_verdict(frames, &messages), "connection closed: bye");
  EXPECT_EQ(messages, (std::vector<std::size_t>{3, 0}));
}

// The server's certificate must name the host the edge dialled, not just chain to its CA.
TEST(Transport, TheClientChecksTheServersName) {
  auto server = listen_server({}, "0.0.0.0");
  auto client = WssClient::connect("127.0.0.2", server->port(), pki_files().edge);
  EndpointEvent ev;
  ASSERT_TRUE(client->next(ev, 10s));
  EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Closed));
  EXPECT_EQ(ev.text, "connection failed: the server's certificate: IP address mismatch");
  auto by_address = WssClient::connect("127.0.0.1", server->port(), pki_files().edge);
  expect_event(*by_address, Kind::Connected);
  EXPECT_EQ(expect_event(*server, Kind::Connected).text, "edge1");
}

// A client whose application lags stops reading (the server's sends wait in TCP) and, once
// read again, delivers every message in order.
TEST(Transport, ALaggingClientPausesAndLosesNothing) {
  auto server = listen_server();
  EndpointOptions shallow;
  shallow.queue_depth = 4;
  auto client = WssClient::connect("localhost", server->port(), pki_files().edge, shallow);
  const EndpointEvent hello = expect_event(*server, Kind::Connected);
  expect_event(*client, Kind::Connected);
  constexpr int kMessages = 40;
  for (int i = 0; i < kMessages; ++i) server->send(hello.connection, pattern(200000, static_cast<uint8_t>(i)));
  std::this_thread::sleep_for(300ms);
  EXPECT_LE(client->queued_events(), 5u);
  for (int i = 0; i < kMessages; ++i) {
    const EndpointEvent got = expect_event(*client, Kind::Message);
    const auto want = pattern(200000, static_cast<uint8_t>(i));
    ASSERT_EQ(got.frame.size(), want.size());
    ASSERT_EQ(std::memcmp(got.frame.data(), want.data(), want.size()), 0) << "message " << i;
  }
}

// Idle connections stay up: the server's pings are answered, and the client's own pings
// are (lws answers them), so neither side hangs up on a quiet peer.
TEST(Transport, IdlePingsKeepAQuietConnection) {
  EndpointOptions quick;
  quick.idle_ping_s = 1;
  quick.idle_hangup_s = 3;
  auto server = listen_server(quick);
  auto client = WssClient::connect("localhost", server->port(), pki_files().edge, quick);
  const EndpointEvent hello = expect_event(*server, Kind::Connected);
  expect_event(*client, Kind::Connected);
  EndpointEvent ev;
  EXPECT_FALSE(client->next(ev, 4500ms)) << "event text: " << ev.text;
  client->send(0, pattern(10, 1));
  EXPECT_EQ(expect_event(*server, Kind::Message).frame.size(), 10u);
  server->send(hello.connection, pattern(20, 2));
  EXPECT_EQ(expect_event(*client, Kind::Message).frame.size(), 20u);
}

}  // namespace
}  // namespace tandem::test
