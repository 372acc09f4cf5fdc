// Encoding of tandem's wire messages (schema/wire.fbs) and the session-level checks of what
// arrives: tensors against the expected dtype and shape, labels, the step window. Checks
// report a WireError instead of throwing; received f32 tensors are read in place.
#pragma once

#include <array>
#include <optional>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"
#include "core/wire/frame.h"
#include "core/wire/tensor_codec.h"

namespace tandem {

// SHA-256 over the binary model spec, a zero byte and the cut's name ("A,B" for a U-shaped
// split): what Hello carries.
std::array<uint8_t, 32> model_hash(const ModelSpec& spec, const std::string& cut);

// Named f32 tensors: a front shard's parameters in FrontWeights and Aggregated.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// What a stage says when it opens a link to the next, and the next answers (StageHello).
struct StageHelloFields {
  std::array<uint8_t, 32> plan_hash{};
  uint32_t stage = 0, stages = 0;
  uint64_t resume_step = 0;
  uint32_t format = kWireFormat;
  uint32_t member = 0;
  uint64_t epoch_steps = 0;
  std::string schedule;
  uint32_t batch = 0, microbatches = 0;
  std::vector<wire::DType> dtypes;  // offered (preferred first), or in an answer the one chosen
  std::array<uint8_t, 32> terms{};  // all zero: none said
  std::string client_id, token;     // a first party to a cloud: its name, its enrolment token
  std::string next_token;           // the cloud's answer to a token: the next one
  std::optional<uint64_t> ended;    // the sender recorded the run's end at this step
};

// A step as the first stage of a pipeline announces it with each micro-batch's Activations.
struct StepHeader {
  uint64_t step = 0;
  uint32_t samples = 0, microbatches = 0;
  float lr_scale = 1.0f;
  bool checkpoint = false;
  // An evaluation batch between steps (nothing trains): the evaluation set's samples from
  // evaluation_begin on.
  bool evaluation = false;
  uint64_t evaluation_begin = 0;
  bool operator==(const StepHeader&) const = default;
};

// Builds one message at a time; the returned bytes stay valid until the next call. The
// builder's memory is reused, so steady-state encoding does not allocate once it has grown.
class MessageWriter {
 public:
  // `dtypes`: what the edge can send, most wanted first.
  std::span<const uint8_t> hello(const std::string& client_id, const std::array<uint8_t, 32>& model_hash,
                                 const std::string& token = "", uint32_t protocol_version = kProtocolVersion,
                                 std::span<const wire::DType> dtypes = kF32Only, uint64_t resume_step = 0);
  std::span<const uint8_t> welcome(uint64_t session_id, uint32_t batch_size, uint32_t microbatches,
                                   uint64_t start_step, wire::DType dtype = wire::DType::F32,
                                   uint32_t aggregate_every = 0, uint32_t round = 0, const std::string& next_token = "");
  std::span<const uint8_t> front_weights(uint32_t round, uint64_t samples, const NamedTensors& tensors,
                                         bool final = false);
  std::span<const uint8_t> aggregated(uint32_t round, uint32_t edges, uint64_t samples, const NamedTensors& tensors);
  // Tensors go out encoded in `dtype` (tensor_codec.h), the session's.
  std::span<const uint8_t> forward(uint64_t step, uint32_t microbatch, uint64_t weight_version,
                                   const Tensor& activations, std::span<const int32_t> labels,
                                   uint32_t step_samples = 0, uint32_t step_microbatches = 0,
                                   wire::DType dtype = wire::DType::F32, float lr_scale = 1.0f,
                                   bool checkpoint = false, const Tensor* mask = nullptr);
  std::span<const uint8_t> backward(uint64_t step, uint32_t microbatch, const Tensor& gradients, float loss,
                                    wire::DType dtype = wire::DType::F32, uint64_t weight_version = 0);
  // `mask`: the key padding mask [samples, tokens] of 0s and 1s, when the cloud's shard reads
  // one (Graph::split); it goes as one byte a token.
  std::span<const uint8_t> eval_forward(uint64_t batch_id, const Tensor& activations, std::span<const int32_t> labels,
                                        wire::DType dtype = wire::DType::F32, const Tensor* mask = nullptr);
  // U-shaped training (schema/wire.fbs): the middle's output down, its gradient up, and the
  // middle's output for an evaluation batch.
  std::span<const uint8_t> middle_output(uint64_t step, uint32_t microbatch, const Tensor& activations,
                                         wire::DType dtype = wire::DType::F32, uint64_t weight_version = 0);
  std::span<const uint8_t> middle_gradient(uint64_t step, uint32_t microbatch, const Tensor& gradients, float loss,
                                           wire::DType dtype = wire::DType::F32);
  std::span<const uint8_t> eval_middle_output(uint64_t batch_id, const Tensor& activations,
                                              wire::DType dtype = wire::DType::F32, double cloud_busy_s = 0.0);
  std::span<const uint8_t> eval_result(uint64_t batch_id, uint32_t correct, uint32_t count, double loss_sum,
                                       double cloud_busy_s = 0.0);
  // A pipeline of stages (pipeline/stage_peer.h): the hello that opens a link, and the
  // activations down and gradients up, named by the sender's stage, encoded in `dtype`.
  std::span<const uint8_t> stage_hello(const StageHelloFields& hello);
  std::span<const uint8_t> evaluated(uint32_t stage, uint64_t step, uint32_t microbatch, float loss, uint32_t correct);
  std::span<const uint8_t> drain(uint32_t stage, uint64_t step, float lr_scale = 1.0f);
  std::span<const uint8_t> activations(const StepHeader& header, uint32_t stage, uint32_t microbatch,
                                       uint64_t weight_version, const Tensor& activations,
                                       std::span<const int32_t> labels, const Tensor* mask,
                                       wire::DType dtype = wire::DType::F32);
  std::span<const uint8_t> gradients(uint32_t stage, uint64_t step, uint32_t microbatch, uint64_t weight_version,
                                     const Tensor& gradients, float loss, uint32_t correct,
                                     wire::DType dtype = wire::DType::F32);
  std::span<const uint8_t> error(wire::ErrorCode code, const std::string& text);
  std::span<const uint8_t> bye(const std::string& reason);

 private:
  static constexpr wire::DType kF32Only[] = {wire::DType::F32};
  flatbuffers::Offset<wire::TensorMsg> tensor(const char* name, const Tensor& t, wire::DType dtype);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::TensorMsg>>> tensors(const NamedTensors& list);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> mask_bytes(const Tensor* mask);  // absent when null
  std::span<const uint8_t> finish(wire::Payload type, flatbuffers::Offset<void> payload);
  flatbuffers::FlatBufferBuilder fbb_{1 << 16};
};

// A received tensor checked against the session: its dtype (`dtype`, the negotiated one),
// `expected` shape exactly, byte count equal to the shape's in that dtype, payload 64-byte
// aligned, every value finite. F32 comes back as a view into the frame (no copy); other
// dtypes are decoded into `decoded` (re-allocated only when its shape differs). On a problem:
// an empty Tensor with `error` set.
Tensor read_tensor(const Frame& frame, const wire::TensorMsg* msg, const Shape& expected, const char* what,
                   wire::DType dtype, Tensor& decoded, WireError& error);
// The same for an F32 session.
Tensor read_tensor(const Frame& frame, const wire::TensorMsg* msg, const Shape& expected, const char* what,
                   WireError& error);

// A list of named f32 tensors that must match `expected` one for one (names, in order, and
// shapes; every value finite); `out` gets views into the frame.
bool read_named_tensors(const Frame& frame,
                        const flatbuffers::Vector<flatbuffers::Offset<wire::TensorMsg>>* list,
                        const NamedTensors& expected, std::vector<Tensor>& out, WireError& error);

// Labels: exactly `count` of them, each in [0, classes).
bool check_labels(const flatbuffers::Vector<int32_t>* labels, int64_t count, int32_t classes, WireError& error);

// A Forward's or EvalForward's mask for a shard that reads one (`tokens` > 0): `count` samples
// of `tokens` bytes, each 0 or 1, into `decoded` [count, tokens] as floats. A shard that reads
// none (`tokens` == 0) must get none. False with `error` (BadTensor) otherwise.
bool read_mask(const flatbuffers::Vector<uint8_t>* mask, int64_t count, int64_t tokens, Tensor& decoded,
               WireError& error);

// The step must be `expected_step` and the micro-batch below `microbatches`.
bool check_window(uint64_t step, uint32_t microbatch, uint64_t expected_step, uint32_t microbatches,
                  WireError& error);

}  // namespace tandem
