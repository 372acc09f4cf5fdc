// Bad input against the real service: a tandem-cloud serve process on a loopback port, and
// raw clients (with a properly issued identity, or none and an enrolment token, as browsers
// connect) that send what a broken or hostile edge might. Each gets the exact Error and a
// closed connection; the service keeps serving.
#include <gtest/gtest.h>

#include <signal.h>

#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <thread>

#include "cloud/pki/pki.h"
#include "cloud/pki/token.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/network.h"
#include "core/optimizer.h"
#include "edge/session/edge_session.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_peer.h"
#include "core/sha256.h"
#include "core/wire/messages.h"
#include "ports/tls/wss_client.h"
#include "test_support.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Kind = EndpointEvent::Kind;

const std::string kModel = std::string(TANDEM_SOURCE_DIR) + "/samples/fashion-mnist/model.json";

// Starts `tandem-cloud serve` (1 MiB message cap) and issues an edge identity for the tests.
class Service {
 public:
  // `model_json`: the spec's text (written to the service's folder), else the Fashion-MNIST sample.
  explicit Service(const std::string& model_json = "") {
    std::string tmpl = (fs::temp_directory_path() / "tandem-svc-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    const std::string log = (dir_ / "cloud.log").string();
    model_ = kModel;
    if (!model_json.empty()) {
      model_ = (dir_ / "model.json").string();
      std::ofstream(model_) << model_json;
    }
    const std::string cmd = std::string(TANDEM_CLOUD_BIN) + " serve --listen 127.0.0.1:0 --state-dir " +
                            (dir_ / "state").string() + " --model " + model_ +
                            " --batch 8 --microbatches 2 --max-message-mb 1 --accept-tokens > " + log + " 2>&1 & echo $!";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p || std::fscanf(p, "%d", &pid_) != 1) fail("test", "cannot start tandem-cloud");
    pclose(p);
    for (int i = 0; i < 100 && port_ == 0; ++i) {
      std::this_thread::sleep_for(100ms);
      if (FILE* f = std::fopen(log.c_str(), "r")) {
        char line[512];
        while (std::fgets(line, sizeof line, f))
          if (const char* at = std::strstr(line, "wss://127.0.0.1:")) port_ = std::atoi(at + 16);
        std::fclose(f);
      }
    }
    if (port_ == 0) fail("test", "tandem-cloud did not report its port");
    pki::issue((dir_ / "state").string(), "probe", (dir_ / "id").string());
    id_ = {(dir_ / "id/client.crt").string(), (dir_ / "id/client.key").string(), (dir_ / "id/ca.crt").string()};
  }
  ~Service() {
    if (pid_ > 0) kill(pid_, SIGTERM);
    std::this_thread::sleep_for(200ms);
    fs::remove_all(dir_);
  }
  std::string token(const std::string& client, int64_t ttl_s = 600, int64_t now = std::time(nullptr)) const {
    return pki::issue_token((dir_ / "state").string(), client, ttl_s, now);
  }
  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  const std::string& model() const { return model_; }
  std::string state_dir() const { return (dir_ / "state").string(); }

  // `with_certificate` false: TLS without a client certificate, as a browser connects.
  std::unique_ptr<WssClient> client(bool with_certificate = true) {
    auto c = WssClient::connect("localhost", port_, with_certificate ? id_ : TlsIdentity{"", "", id_.ca});
    EndpointEvent ev;
    EXPECT_TRUE(c->next(ev, 10s));
    EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Connected)) << ev.text;
    return c;
  }

 private:
  fs::path dir_;
  std::string model_;
  int pid_ = 0, port_ = 0;
  TlsIdentity id_;
};

Service& service() {
  static Service s;
  return s;
}

// Sends each message in turn and expects the last reply to be Error(code, text), then a close.
void expect_error(std::vector<std::vector<uint8_t>> messages, wire::ErrorCode code, const std::string& text,
                  bool with_certificate = true) {
  auto c = service().client(with_certificate);
  for (const auto& m : messages) c->send(0, m);
  EndpointEvent ev;
  const wire::Message* reply = nullptr;
  Frame last;
  while (c->next(ev, 10s) && ev.kind == Kind::Message) {
    last = std::move(ev.frame);
    WireError err;
    reply = verify_frame(last, kDefaultMaxMessageBytes, err);
    ASSERT_NE(reply, nullptr) << err.text;
    if (reply->payload_type() == wire::Payload::Error) break;
  }
  ASSERT_NE(reply, nullptr) << "no reply";
  ASSERT_EQ(reply->payload_type(), wire::Payload::Error) << payload_name(reply->payload_type());
  EXPECT_EQ(reply->payload_as_Error()->code(), code);
  EXPECT_EQ(reply->payload_as_Error()->text()->str(), text);
  ASSERT_TRUE(c->next(ev, 10s));
  EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Closed)) << "the connection stays open";
  EXPECT_TRUE(service().alive());
}

std::vector<uint8_t> bytes(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

std::vector<uint8_t> good_hello() {
  const ModelSpec spec = load_model_spec(kModel);
  MessageWriter w;
  return bytes(w.hello("probe", model_hash(spec, "pool2")));
}

std::vector<uint8_t> forward(const Tensor& a, int32_t label = 1, uint32_t step_samples = 8) {
  MessageWriter w;
  std::vector<int32_t> labels(static_cast<std::size_t>(a.shape()[0]), label);
  return bytes(w.forward(0, 0, 0, a, labels, step_samples, 2));
}

Tensor activations(int64_t n = 4, int64_t c = 64) {
  Rng rng(1);
  return random_tensor({n, 7, 7, c}, rng);
}

TEST(Service, GarbageFrame) {
  expect_error({std::vector<uint8_t>(300, 0x41)}, wire::ErrorCode::Malformed,
               "not a tandem wire message (missing identifier 'TDMW')");
}

TEST(Service, TruncatedFrame) {
  auto f = forward(activations());
  f.resize(f.size() / 2);
  expect_error({good_hello(), f}, wire::ErrorCode::Malformed,
               "message failed FlatBuffers verification (truncated or corrupt)");
}

TEST(Service, FrameOverTheSizeCap) {
  expect_error({good_hello(), std::vector<uint8_t>(2 << 20, 7)}, wire::ErrorCode::TooLarge,
               "message exceeds the limit of 1048576 bytes");
}

TEST(Service, WrongModelHash) {
  MessageWriter w;
  const ModelSpec spec = load_model_spec(kModel);
  const auto ours = model_hash(spec, "pool2");
  const auto theirs = model_hash(spec, "pool1");
  expect_error({bytes(w.hello("probe", theirs))}, wire::ErrorCode::ModelMismatch,
               "the edge's model spec or cut differs from the cloud's (hash " + to_hex(theirs.data(), 32).substr(0, 16) +
                   "... vs " + to_hex(ours.data(), 32).substr(0, 16) + "...)");
}

TEST(Service, WrongShapes) {
  expect_error({good_hello(), forward(activations(4, 32))}, wire::ErrorCode::BadTensor,
               "activations: shape [4, 7, 7, 32] differs from the expected [4, 7, 7, 64]");
}

TEST(Service, NanActivations) {
  Tensor a = activations();
  a[100] = std::numeric_limits<float>::quiet_NaN();
  expect_error({good_hello(), forward(a)}, wire::ErrorCode::BadTensor, "activations: non-finite value at element 100");
}

// Browsers: TLS without a client certificate, and an enrolment token in Hello.
std::vector<uint8_t> token_hello(const std::string& token, const std::string& client = "ward-7") {
  const ModelSpec spec = load_model_spec(kModel);
  MessageWriter w;
  return bytes(w.hello(client, model_hash(spec, "pool2"), token));
}

void expect_welcome(std::unique_ptr<WssClient> c, const std::vector<uint8_t>& hello) {
  c->send(0, hello);
  EndpointEvent ev;
  ASSERT_TRUE(c->next(ev, 10s));
  ASSERT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Message)) << ev.text;
  WireError err;
  const wire::Message* m = verify_frame(ev.frame, kDefaultMaxMessageBytes, err);
  ASSERT_NE(m, nullptr) << err.text;
  ASSERT_EQ(m->payload_type(), wire::Payload::Welcome)
      << (m->payload_type() == wire::Payload::Error ? m->payload_as_Error()->text()->str() : "");
}

TEST(Service, NoCertificateAndNoToken) {
  expect_error({token_hello("")}, wire::ErrorCode::Unauthorized,
               "no client certificate and no enrolment token: give the edge an identity (`tandem-cloud pki issue`) "
               "or a token (`tandem-cloud pki token`)",
               false);
}

TEST(Service, ForgedToken) {
  std::string token = service().token("ward-7");
  token[token.size() - 3] = token[token.size() - 3] == 'A' ? 'B' : 'A';
  expect_error({token_hello(token)}, wire::ErrorCode::Unauthorized,
               "the enrolment token's signature does not verify against this cloud's CA (forged, altered, or issued "
               "by another cloud)",
               false);
}

TEST(Service, ExpiredToken) {
  const int64_t t0 = 1'700'000'000;  // 2023-11-14 22:13:20 UTC
  expect_error({token_hello(service().token("ward-7", 60, t0))}, wire::ErrorCode::Unauthorized,
               "the enrolment token expired at 2023-11-14 22:14:20 UTC; issue a new one with `tandem-cloud pki token`",
               false);
}

TEST(Service, TokenForAnotherClient) {
  expect_error({token_hello(service().token("ward-7"), "ward-8")}, wire::ErrorCode::Unauthorized,
               "the enrolment token is for client 'ward-7', but the edge says it is 'ward-8'", false);
}

TEST(Service, ReplayedToken) {
  const std::string token = service().token("ward-7");
  expect_welcome(service().client(false), token_hello(token));
  expect_error({token_hello(token)}, wire::ErrorCode::Unauthorized,
               "the enrolment token was already used: tokens are single-use; issue a new one with `tandem-cloud pki "
               "token`",
               false);
}

// A certificate issued to one client ("probe") cannot train as another: the Hello's client
// id must be the certificate's name. The refusal comes before the resume it asks for reads
// anything, and nothing is written under the other's name.
TEST(Service, CertificateOfAnotherClientIsRefused) {
  const ModelSpec spec = load_model_spec(kModel);
  MessageWriter w;
  const wire::DType f32[] = {wire::DType::F32};
  expect_error({bytes(w.hello("bob", model_hash(spec, "pool2"), "", kProtocolVersion, f32, /*resume_step=*/5))},
               wire::ErrorCode::Unauthorized,
               "the Hello says client id 'bob' but the client certificate was issued to 'probe': an edge trains only "
               "as the identity it holds");
  EXPECT_FALSE(fs::exists(service().state_dir() + "/checkpoints/bob"));
}

TEST(Service, CertificateEdgesNeedNoToken) { expect_welcome(service().client(), good_hello()); }

// A pipeline's first party (`tandem stage`): a StageHello of the first of two stages cut at
// pool2, batch 8 in 2 (the cloud's limits), `change`d.
std::vector<uint8_t> stage_hello(const std::function<void(StageHelloFields&)>& change = {}) {
  const ModelSpec spec = load_model_spec(kModel);
  const Graph graph = Graph::build(spec);
  const GPipeSchedule gpipe;
  const StagePlan plan = make_stage_plan(spec.binary, graph, "pool2", graph.partition({"pool2"}), 0, gpipe, 8, 2);
  StageHelloFields f = stage_hello_fields(plan, gpipe.name(), 0);
  if (change) change(f);
  MessageWriter w;
  return bytes(w.stage_hello(f));
}

// Sends a StageHello and returns the cloud's answer, a StageHello (else empty, after a failure).
Frame stage_answer(WssClient& c, const std::vector<uint8_t>& hello) {
  c.send(0, hello);
  EndpointEvent ev;
  EXPECT_TRUE(c.next(ev, 10s));
  if (ev.kind != Kind::Message) {
    ADD_FAILURE() << "no answer: " << ev.text;
    return {};
  }
  WireError err;
  const wire::Message* m = verify_frame(ev.frame, kDefaultMaxMessageBytes, err);
  if (m == nullptr || m->payload_type() != wire::Payload::StageHello) {
    ADD_FAILURE() << "not a StageHello: " << (m ? payload_name(m->payload_type()) : err.text.c_str());
    return {};
  }
  return std::move(ev.frame);
}

// The cloud keeps the party's last stage: it answers StageHello with the first dtype offered
// that it takes (--wire-dtypes: all four by default) and the step to start from.
TEST(Service, APipelinesFirstPartyIsAnsweredWithTheDtypeItOffered) {
  auto c = service().client();
  const Frame answer = stage_answer(*c, stage_hello([](StageHelloFields& f) { f.dtypes = {wire::DType::I8, wire::DType::F32}; }));
  const wire::StageHello* h = answer.size() > 0 ? wire::GetMessage(answer.data())->payload_as_StageHello() : nullptr;
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->stage(), 1u);
  EXPECT_EQ(h->resume_step(), 0u);
  ASSERT_EQ(h->dtypes()->size(), 1u);
  EXPECT_EQ(h->dtypes()->Get(0), wire::DType::I8);
}

// Without a client certificate a first party names itself and brings an enrolment token, as
// an edge's Hello does; the cloud answers a good one with a fresh token for the next link.
TEST(Service, APipelinesFirstPartyWithATokenIsAnsweredWithTheNextOne) {
  std::string token = service().token("ward-7");
  for (int link = 0; link < 2; ++link) {  // the second with the token the first answer gave
    auto c = service().client(false);
    const Frame answer = stage_answer(*c, stage_hello([&](StageHelloFields& f) {
                                        f.client_id = "ward-7";
                                        f.token = token;
                                      }));
    const wire::StageHello* h = answer.size() > 0 ? wire::GetMessage(answer.data())->payload_as_StageHello() : nullptr;
    ASSERT_NE(h, nullptr);
    ASSERT_NE(h->next_token(), nullptr);
    EXPECT_NE(h->next_token()->str(), token);
    token = h->next_token()->str();
  }
}

TEST(Service, APipelinesFirstPartyWithoutACertificateOrAGoodTokenIsRefused) {
  const auto without_certificate = [](const std::string& client, const std::string& token) {
    return stage_hello([&](StageHelloFields& f) {
      f.client_id = client;
      f.token = token;
    });
  };
  expect_error({without_certificate("ward-7", "")}, wire::ErrorCode::Unauthorized,
               "no client certificate and no enrolment token: give the edge an identity (`tandem-cloud pki issue`) "
               "or a token (`tandem-cloud pki token`)",
               false);
  expect_error({without_certificate("ward-8", service().token("ward-7"))}, wire::ErrorCode::Unauthorized,
               "the enrolment token is for client 'ward-7', but the edge says it is 'ward-8'", false);
  expect_error({without_certificate("../ward", service().token("ward-7"))}, wire::ErrorCode::Malformed,
               "the client id must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'", false);
  // With a certificate, the name it says must be the certificate's.
  expect_error({without_certificate("bob", "")}, wire::ErrorCode::Unauthorized,
               "the StageHello says client id 'bob' but the client certificate was issued to 'probe': a party trains "
               "only as the identity it holds");
}

TEST(Service, APipelinesFirstPartyOutsideTheCloudsLimitsIsRefusedByName) {
  expect_error({stage_hello([](StageHelloFields& f) { f.batch = 16; })}, wire::ErrorCode::ModelMismatch,
               "the previous stage plans steps of at most 16 samples in 2 micro-batches, and stage 1 takes at most 8 "
               "in 2: plan a smaller batch or fewer micro-batches");
  expect_error({stage_hello([](StageHelloFields& f) { f.schedule = "round-robin"; })}, wire::ErrorCode::ModelMismatch,
               cat("the first party's schedule: [schedule] unknown pipeline schedule 'round-robin': use one of ",
                   pipeline_schedule_names()));
  expect_error({stage_hello([](StageHelloFields& f) { f.plan_hash[0] ^= 1; })}, wire::ErrorCode::ModelMismatch,
               "the previous stage runs another plan (its model spec, cut list, number of stages, where the labels "
               "are or first parties differ from stage 1's): give every party the same deployment");
  expect_error({stage_hello([](StageHelloFields& f) { f.dtypes = {}; })}, wire::ErrorCode::ModelMismatch,
               "the previous stage sends no dtype and stage 1 takes f32, f16, bf16, i8: offer one of those");
  // and serves the next one
  expect_welcome(service().client(), good_hello());
}

TEST(Service, KeepsServingAProperEdge) {
  auto c = service().client();
  c->send(0, good_hello());
  c->send(0, forward(activations()));
  EndpointEvent ev;
  std::vector<wire::Payload> kinds;
  for (int i = 0; i < 2 && c->next(ev, 10s) && ev.kind == Kind::Message; ++i) {
    WireError err;
    const wire::Message* m = verify_frame(ev.frame, kDefaultMaxMessageBytes, err);
    ASSERT_NE(m, nullptr);
    kinds.push_back(m->payload_type());
  }
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[0], wire::Payload::Welcome);
  EXPECT_EQ(kinds[1], wire::Payload::Backward);
}

// A model with 100 classes trains over TLS against the real service: labels up to 99 are
// taken (the service once took its class count as 10 and refused them), and the loss of a
// fixed batch falls as an in-process edge session trains the front against it.
TEST(Service, HundredClassModelTrains) {
  std::ifstream in(kModel);
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = json.find("out_features: 10 }");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, 18, "out_features: 100 }");
  Service svc(json);
  const ModelSpec spec = load_model_spec(svc.model());
  const Graph graph = Graph::build(spec);
  ASSERT_EQ(graph.classes(), 100);
  auto backend = make_backend("reference");
  Network front(graph.split("pool2").first, *backend, 1);
  init_from_whole_model(graph, 1, front, *backend);
  Sgd sgd(front.params(), {.lr = 0.05f, .momentum = 0.9f});
  EdgeSession edge(front, sgd, 2, model_hash(spec, "pool2"), "probe", {wire::DType::F32});
  auto c = svc.client();
  auto reply = [&] {
    EndpointEvent ev;
    EXPECT_TRUE(c->next(ev, 20s));
    EXPECT_EQ(static_cast<int>(ev.kind), static_cast<int>(Kind::Message)) << ev.text;
    return std::move(ev.frame);
  };
  c->send(0, bytes(edge.hello()));
  WireError err;
  ASSERT_TRUE(edge.on_welcome(reply(), err)) << err.text;
  Rng rng(3);
  const Tensor images = random_tensor({8, 28, 28, 1}, rng, 0.0f, 1.0f);
  const std::vector<int32_t> labels{0, 99, 42, 7, 63, 99, 18, 85};
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    const int k = edge.begin_step(images, labels.data());
    for (int mb = 0; mb < k; ++mb) c->send(0, bytes(edge.forward(mb)));
    for (bool done = false; !done;) ASSERT_TRUE(edge.on_backward(reply(), err, done)) << err.text;
    (step == 0 ? first : last) = edge.step_loss_sum() / 8;
  }
  EXPECT_NEAR(first, std::log(100.0), 1.0);  // chance over 100 classes
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

}  // namespace
}  // namespace tandem::test
