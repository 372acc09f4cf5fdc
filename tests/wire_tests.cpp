// Wire protocol tests: messages round-trip with tensors read in place from aligned frames,
// and every kind of bad input is refused with the exact error code and text, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/sha256.h"
#include "core/wire/messages.h"
#include "test_support.h"

namespace tandem::test {
namespace {

Frame frame_of(std::span<const uint8_t> bytes) { return Frame::copy_of(bytes.data(), bytes.size()); }

Tensor activations(int64_t n = 4) {
  Rng rng(1);
  return random_tensor({n, 7, 7, 64}, rng);
}

TEST(Sha256, KnownVectors) {
  auto hex = [](const std::string& s) {
    const auto d = sha256(s.data(), s.size());
    return to_hex(d.data(), d.size());
  };
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 chunked;  // split across block boundaries
  const std::string million(1000000, 'a');
  for (std::size_t i = 0; i < million.size(); i += 997) chunked.update(million.data() + i, std::min<std::size_t>(997, million.size() - i));
  const auto d = chunked.finish();
  EXPECT_EQ(to_hex(d.data(), d.size()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// --- tensor codec ----------------------------------------------------------------------

std::vector<uint16_t> halves(wire::DType d, const std::vector<float>& v, float* scale = nullptr) {
  std::vector<uint16_t> out(v.size());
  const float s = encode_tensor(d, v.data(), static_cast<int64_t>(v.size()), reinterpret_cast<uint8_t*>(out.data()));
  if (scale) *scale = s;
  return out;
}

TEST(Codec, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even (1).
  const std::vector<float> v = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f};
  const auto b = halves(wire::DType::BF16, v);
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0xc020);
  EXPECT_EQ(b[2], 0x3f80);  // tie, to even
  EXPECT_EQ(b[3], 0x3f82);  // tie, to even (up)
  EXPECT_EQ(b[4], 0x3f81);  // above the tie: up
}

TEST(Codec, F16IsScaledByAPowerOfTwoAndRoundsToNearestEven) {
  float scale = 0.0f;
  // max |x| = 3 -> scale 2^(1 - 14): 3 is sent as 3 * 2^13 = 24576 (0x7600).
  const auto h = halves(wire::DType::F16, {3.0f, -1.0f, 0.0f, 3.0f * 0x1p-35f}, &scale);
  EXPECT_EQ(scale, 0x1p-13f);
  EXPECT_EQ(h[0], 0x7600);
  EXPECT_EQ(h[1], 0xf000);  // -8192
  EXPECT_EQ(h[2], 0x0000);
  EXPECT_EQ(h[3], 0x000c);  // 3 * 2^-22 = 12 * 2^-24: a subnormal half
  // Round to nearest even at the 11th bit: 2048 + 1 is a tie between 2048 and 2050.
  const auto t = halves(wire::DType::F16, {16384.0f, 2049.0f, 2051.0f}, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(t[1], 0x6800);  // 2048
  EXPECT_EQ(t[2], 0x6802);  // 2052
}

TEST(Codec, RoundTripsWithinEachDtypesPrecision) {
  Rng rng(11);
  std::vector<float> v(4099);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, static_cast<int>(rng.below(20)) - 10);
  v[17] = 0.0f;
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  const auto n = static_cast<int64_t>(v.size());
  for (const auto& [d, rel, abs_of_max] : {std::tuple{wire::DType::F32, 0.0f, 0.0f}, std::tuple{wire::DType::F16, 0x1p-11f, 0x1p-25f},
                                          std::tuple{wire::DType::BF16, 0x1p-8f, 0.0f}, std::tuple{wire::DType::I8, 0.0f, 0.5f / 127}}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<uint8_t> bytes(encoded_bytes(d, n));
    const float scale = encode_tensor(d, v.data(), n, bytes.data());
    std::vector<float> back(v.size());
    std::string why;
    ASSERT_TRUE(decode_tensor(d, bytes.data(), n, scale, back.data(), why)) << why;
    for (std::size_t i = 0; i < v.size(); ++i)
      ASSERT_LE(std::fabs(back[i] - v[i]), rel * std::fabs(v[i]) + abs_of_max * m * 1.0001f) << "element " << i;
  }
}

TEST(Codec, RefusesNonFiniteEncodingsAndScales) {
  std::string why;
  float out[3];
  const uint16_t f16[] = {0x3c00, 0x7c00, 0x0000};  // 1, +inf, 0
  EXPECT_FALSE(decode_tensor(wire::DType::F16, reinterpret_cast<const uint8_t*>(f16), 3, 1.0f, out, why));
  EXPECT_EQ(why, "non-finite value at element 1");
  const uint16_t bf16[] = {0x3f80, 0x3f80, 0x7fc0};  // 1, 1, NaN
  EXPECT_FALSE(decode_tensor(wire::DType::BF16, reinterpret_cast<const uint8_t*>(bf16), 3, 1.0f, out, why));
  EXPECT_EQ(why, "non-finite value at element 2");
  const int8_t i8[] = {1, 2, 3};
  EXPECT_FALSE(decode_tensor(wire::DType::I8, reinterpret_cast<const uint8_t*>(i8), 3, std::numeric_limits<float>::infinity(), out, why));
  EXPECT_EQ(why, "scale inf is not a finite non-negative number");
  const uint16_t big[] = {0x7bff, 0, 0};  // 65504 times a scale that overflows f32
  EXPECT_FALSE(decode_tensor(wire::DType::F16, reinterpret_cast<const uint8_t*>(big), 3, 1e36f, out, why));
  EXPECT_EQ(why, "non-finite value at element 0");
}

// Found by tests/fuzz (cloud_session, tests/fuzz/regressions/cloud_session/): a NaN reached
// the I8 encoder, whose clamp let it through to a float-to-int8 conversion (undefined; UBSan
// reported it). Senders refuse non-finite tensors first; the encoder itself stays defined.
TEST(Codec, I8EncodingOfNonFiniteValuesIsDefined) {
  const float v[] = {std::numeric_limits<float>::quiet_NaN(), 1.0f, -std::numeric_limits<float>::quiet_NaN(), -1.0f};
  int8_t out[4];
  EXPECT_EQ(encode_tensor(wire::DType::I8, v, 4, reinterpret_cast<uint8_t*>(out)), 1.0f / 127.0f);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 127);
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[3], -127);
  const float inf[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(encode_tensor(wire::DType::I8, inf, 2, reinterpret_cast<uint8_t*>(out)), 1.0f);
  EXPECT_EQ(out[0], 127);
  EXPECT_EQ(out[1], -127);
}

TEST(Wire, CompressedForwardRoundTripsThroughTheMessage) {
  MessageWriter writer;
  const Tensor a = activations(3);
  const int32_t labels[] = {1, 2, 3};
  for (const wire::DType d : {wire::DType::F16, wire::DType::BF16, wire::DType::I8}) {
    SCOPED_TRACE(dtype_name(d));
    Frame f = frame_of(writer.forward(7, 2, 42, a, labels, 3, 1, d));
    WireError err;
    const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
    ASSERT_NE(m, nullptr) << err.text;
    Tensor decoded;
    Tensor got = read_tensor(f, m->payload_as_Forward()->activations(), a.shape(), "activations", d, decoded, err);
    ASSERT_TRUE(got.defined()) << err.text;
    EXPECT_EQ(got.data(), decoded.data()) << "decoded into the caller's buffer";
    const float tolerance = d == wire::DType::I8 ? 1.0f / 127 : d == wire::DType::BF16 ? 0x1p-8f : 0x1p-10f;
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(got.data()[i], a.data()[i], tolerance) << "element " << i;
    // The same frame read as another dtype is refused, naming both.
    const wire::DType other = d == wire::DType::I8 ? wire::DType::F16 : wire::DType::I8;
    EXPECT_FALSE(read_tensor(f, m->payload_as_Forward()->activations(), a.shape(), "activations", other, decoded, err).defined());
    EXPECT_EQ(err.text, cat("activations: dtype ", wire::EnumNameDType(d), " was not negotiated (this session uses ",
                            wire::EnumNameDType(other), ")"));
  }
}

TEST(Wire, ForwardRoundTripReadsInPlace) {
  MessageWriter writer;
  Tensor a = activations();
  const int32_t labels[4] = {1, 2, 3, 9};
  Frame f = frame_of(writer.forward(7, 2, 42, a, labels));
  WireError err;
  const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
  ASSERT_NE(m, nullptr) << err.text;
  ASSERT_EQ(m->payload_type(), wire::Payload::Forward);
  const auto* fwd = m->payload_as_Forward();
  EXPECT_EQ(fwd->step(), 7u);
  EXPECT_EQ(fwd->microbatch(), 2u);
  EXPECT_EQ(fwd->weight_version(), 42u);
  Tensor got = read_tensor(f, fwd->activations(), a.shape(), "activations", err);
  ASSERT_TRUE(err.ok()) << err.text;
  EXPECT_GE(got.data(), reinterpret_cast<const float*>(f.data()));  // a view into the frame
  EXPECT_LT(reinterpret_cast<const uint8_t*>(got.data()), f.data() + f.size());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.data()) % 64, 0u);
  EXPECT_EQ(std::memcmp(got.data(), a.data(), a.bytes()), 0);
  EXPECT_TRUE(check_labels(fwd->labels(), 4, 10, err)) << err.text;
}

TEST(Wire, OverheadWithinTwoPercentOfRawBytes) {
  MessageWriter writer;
  Tensor a = activations(64);  // a 64 x 3136 micro-batch: about 0.8 MB
  std::vector<int32_t> labels(64, 3);
  const auto bytes = writer.forward(1, 0, 1, a, labels);
  const double raw = static_cast<double>(a.bytes() + labels.size() * sizeof(int32_t));
  EXPECT_LE(static_cast<double>(bytes.size()), raw * 1.02) << bytes.size() << " bytes for " << raw << " raw";
  Tensor g = activations(64);
  EXPECT_LE(static_cast<double>(writer.backward(1, 0, g, 1.0f).size()), static_cast<double>(g.bytes()) * 1.02);
}

TEST(Wire, OtherMessagesRoundTrip) {
  MessageWriter writer;
  WireError err;
  std::array<uint8_t, 32> hash{};
  hash[0] = 0xab;
  Frame hello = frame_of(writer.hello("hospital-a", hash, "tok"));
  const auto* h = verify_frame(hello, kDefaultMaxMessageBytes, err)->payload_as_Hello();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->protocol_version(), kProtocolVersion);
  EXPECT_EQ(h->client_id()->str(), "hospital-a");
  EXPECT_EQ(h->model_hash()->size(), 32u);
  EXPECT_EQ(h->model_hash()->Get(0), 0xab);
  Frame e = frame_of(writer.error(wire::ErrorCode::ModelMismatch, "different model"));
  const auto* er = verify_frame(e, kDefaultMaxMessageBytes, err)->payload_as_Error();
  ASSERT_NE(er, nullptr);
  EXPECT_EQ(er->code(), wire::ErrorCode::ModelMismatch);
  EXPECT_EQ(er->text()->str(), "different model");
  Frame w = frame_of(writer.welcome(5, 64, 4, 100));
  const auto* we = verify_frame(w, kDefaultMaxMessageBytes, err)->payload_as_Welcome();
  ASSERT_NE(we, nullptr);
  EXPECT_EQ(we->start_step(), 100u);
  Frame r = frame_of(writer.eval_result(3, 90, 100, 12.5));
  EXPECT_EQ(verify_frame(r, kDefaultMaxMessageBytes, err)->payload_as_EvalResult()->correct(), 90u);
  Frame b = frame_of(writer.bye("done"));
  EXPECT_EQ(verify_frame(b, kDefaultMaxMessageBytes, err)->payload_as_Bye()->reason()->str(), "done");
}

TEST(Wire, ModelHashCoversSpecAndCut) {
  ModelSpec spec;
  spec.binary = {1, 2, 3};
  EXPECT_NE(model_hash(spec, "pool2"), model_hash(spec, "pool1"));
  ModelSpec other = spec;
  other.binary[2] = 4;
  EXPECT_NE(model_hash(spec, "pool2"), model_hash(other, "pool2"));
  EXPECT_EQ(model_hash(spec, "pool2"), model_hash(spec, "pool2"));
}

// --- bad input: each case gets its exact code and text -----------------------------------

WireError verify_error(std::span<const uint8_t> bytes, std::size_t cap = kDefaultMaxMessageBytes) {
  Frame f = frame_of(bytes);
  WireError err;
  EXPECT_EQ(verify_frame(f, cap, err), nullptr);
  return err;
}

TEST(WireBadInput, GarbageFrame) {
  std::vector<uint8_t> junk(256);
  Rng rng(3);
  for (auto& b : junk) b = static_cast<uint8_t>(rng.next());
  WireError err = verify_error(junk);
  EXPECT_EQ(err.code, wire::ErrorCode::Malformed);
  EXPECT_EQ(err.text, "not a tandem wire message (missing identifier 'TDMW')");
  // Garbage behind a valid identifier still fails verification.
  std::memcpy(junk.data() + 4, "TDMW", 4);
  err = verify_error(junk);
  EXPECT_EQ(err.code, wire::ErrorCode::Malformed);
  EXPECT_EQ(err.text, "message failed FlatBuffers verification (truncated or corrupt)");
  EXPECT_EQ(verify_error({}).code, wire::ErrorCode::Malformed);
}

TEST(WireBadInput, TruncatedFrameAtEveryLength) {
  MessageWriter writer;
  const int32_t labels[2] = {0, 1};
  Tensor a = activations(2);
  const auto bytes = writer.forward(1, 0, 1, a, labels);
  const std::vector<uint8_t> whole(bytes.begin(), bytes.end());
  for (std::size_t n = 0; n < whole.size(); n += n < 256 ? 1 : 509) {
    WireError err = verify_error(std::span<const uint8_t>(whole.data(), n));
    ASSERT_EQ(err.code, wire::ErrorCode::Malformed) << "prefix of " << n << " bytes";
  }
}

TEST(WireBadInput, BitFlipsNeverCrash) {
  MessageWriter writer;
  const int32_t labels[2] = {0, 1};
  const auto bytes = writer.forward(1, 0, 1, activations(2), labels);
  const std::vector<uint8_t> whole(bytes.begin(), bytes.end());
  Rng rng(5);
  // Each flip ends in one of three ways, and the test must have seen every one of them, or it
  // did not exercise what it claims: refused by the verifier, refused by the session's checks
  // (tensor or labels), or read as a valid Forward (a flip in a value that stays legal).
  int unverifiable = 0, refused = 0, accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = whole;
    const std::size_t at = rng.below(std::min<std::size_t>(b.size(), 160));  // the header and tables
    b[at] ^= static_cast<uint8_t>(1u << rng.below(8));
    Frame f = frame_of(b);
    WireError err;
    const wire::Message* m = verify_frame(f, kDefaultMaxMessageBytes, err);
    if (!m || m->payload_type() != wire::Payload::Forward) {
      ++unverifiable;
      continue;
    }
    const auto* fwd = m->payload_as_Forward();
    const Tensor t = read_tensor(f, fwd->activations(), Shape{2, 7, 7, 64}, "activations", err);
    const bool ok = t.defined() && check_labels(fwd->labels(), 2, 10, err);
    ++(ok ? accepted : refused);
  }
  // ASan and UBSan watch every flip in debug-asan; here, each kind of ending happened.
  EXPECT_GT(unverifiable, 0);
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_EQ(unverifiable + refused + accepted, 2000);
}

TEST(WireBadInput, OverTheSizeCap) {
  MessageWriter writer;
  const int32_t labels[4] = {0, 1, 2, 3};
  const auto bytes = writer.forward(1, 0, 1, activations(), labels);
  WireError err = verify_error(bytes, 1000);
  EXPECT_EQ(err.code, wire::ErrorCode::TooLarge);
  EXPECT_EQ(err.text, cat("message of ", bytes.size(), " bytes exceeds the limit of 1000"));
}

TEST(WireBadInput, UnknownPayloadType) {
  // A Message whose union type is past the last known payload.
  flatbuffers::FlatBufferBuilder fbb;
  const auto bye = wire::CreateBye(fbb, fbb.CreateString("x"));
  fbb.Finish(wire::CreateMessage(fbb, static_cast<wire::Payload>(200), bye.Union()), wire::MessageIdentifier());
  WireError err = verify_error({fbb.GetBufferPointer(), fbb.GetSize()});
  EXPECT_EQ(err.code, wire::ErrorCode::Malformed);
  EXPECT_EQ(err.text, "message has no known payload (type 200)");
}

struct Received {
  Frame frame;
  const wire::Forward* forward;
};
Received receive(std::span<const uint8_t> bytes) {
  Received r{frame_of(bytes), nullptr};
  WireError err;
  const wire::Message* m = verify_frame(r.frame, kDefaultMaxMessageBytes, err);
  EXPECT_NE(m, nullptr) << err.text;
  r.forward = m ? m->payload_as_Forward() : nullptr;
  return r;
}

TEST(WireBadInput, WrongShape) {
  MessageWriter writer;
  const int32_t labels[4] = {0, 1, 2, 3};
  Received r = receive(writer.forward(1, 0, 1, activations(), labels));
  WireError err;
  EXPECT_FALSE(read_tensor(r.frame, r.forward->activations(), Shape{4, 7, 7, 32}, "activations", err).defined());
  EXPECT_EQ(err.code, wire::ErrorCode::BadTensor);
  EXPECT_EQ(err.text, "activations: shape [4, 7, 7, 64] differs from the expected [4, 7, 7, 32]");
}

TEST(WireBadInput, ByteCountDisagreesWithShape) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint8_t> data(100);
  const auto d = fbb.CreateVector(data);
  const int64_t dims[2] = {4, 8};
  const auto t = wire::CreateTensorMsg(fbb, fbb.CreateString("a"), wire::DType::F32, fbb.CreateVector(dims, 2), 1.0f, d);
  fbb.Finish(wire::CreateMessage(fbb, wire::Payload::Forward, wire::CreateForward(fbb, 1, 0, 1, t).Union()),
             wire::MessageIdentifier());
  Received r = receive({fbb.GetBufferPointer(), fbb.GetSize()});
  WireError err;
  EXPECT_FALSE(read_tensor(r.frame, r.forward->activations(), Shape{4, 8}, "activations", err).defined());
  EXPECT_EQ(err.code, wire::ErrorCode::BadTensor);
  EXPECT_EQ(err.text, "activations: carries 100 bytes, its shape needs 128");
}

TEST(WireBadInput, NonFiniteActivations) {
  MessageWriter writer;
  const int32_t labels[4] = {0, 1, 2, 3};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Tensor a = activations();
    a[1234] = bad;
    Received r = receive(writer.forward(1, 0, 1, a, labels));
    WireError err;
    EXPECT_FALSE(read_tensor(r.frame, r.forward->activations(), a.shape(), "activations", err).defined());
    EXPECT_EQ(err.code, wire::ErrorCode::BadTensor);
    EXPECT_EQ(err.text, "activations: non-finite value at element 1234");
  }
}

TEST(WireBadInput, MissingOrUnnegotiatedTensor) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateMessage(fbb, wire::Payload::Forward, wire::CreateForward(fbb, 1, 0, 1).Union()),
             wire::MessageIdentifier());
  Received r = receive({fbb.GetBufferPointer(), fbb.GetSize()});
  WireError err;
  read_tensor(r.frame, r.forward->activations(), Shape{1}, "activations", err);
  EXPECT_EQ(err.text, "activations: missing");

  flatbuffers::FlatBufferBuilder fbb2;
  const auto t = wire::CreateTensorMsg(fbb2, 0, wire::DType::F16);
  fbb2.Finish(wire::CreateMessage(fbb2, wire::Payload::Forward, wire::CreateForward(fbb2, 1, 0, 1, t).Union()),
              wire::MessageIdentifier());
  Received r2 = receive({fbb2.GetBufferPointer(), fbb2.GetSize()});
  read_tensor(r2.frame, r2.forward->activations(), Shape{1}, "activations", err);
  EXPECT_EQ(err.code, wire::ErrorCode::BadTensor);
  EXPECT_EQ(err.text, "activations: dtype F16 was not negotiated (this session uses F32)");
}

TEST(WireBadInput, LabelsAndWindow) {
  MessageWriter writer;
  const int32_t labels[4] = {0, 1, 12, 3};
  Received r = receive(writer.forward(9, 5, 1, activations(), labels));
  WireError err;
  EXPECT_FALSE(check_labels(r.forward->labels(), 4, 10, err));
  EXPECT_EQ(err.text, "labels: 12 at 2 is outside [0, 10)");
  EXPECT_FALSE(check_labels(r.forward->labels(), 3, 10, err));
  EXPECT_EQ(err.text, "labels: 4 given for a micro-batch of 3");
  EXPECT_FALSE(check_window(r.forward->step(), r.forward->microbatch(), 9, 4, err));
  EXPECT_EQ(err.code, wire::ErrorCode::OutOfWindow);
  EXPECT_EQ(err.text, "step 9 micro-batch 5 is outside the window (step 9, micro-batches 0..3)");
  EXPECT_FALSE(check_window(8, 0, 9, 4, err));
  EXPECT_TRUE(check_window(9, 3, 9, 4, err));
}

}  // namespace
}  // namespace tandem::test
