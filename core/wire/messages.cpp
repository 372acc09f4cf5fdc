#include "core/wire/messages.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/flatbuffer_read.h"
#include "core/sha256.h"

namespace tandem {

std::array<uint8_t, 32> model_hash(const ModelSpec& spec, const std::string& cut) {
  Sha256 h;
  h.update(spec.binary.data(), spec.binary.size());
  const uint8_t zero = 0;
  h.update(&zero, 1);
  h.update(cut.data(), cut.size());
  return h.finish();
}

flatbuffers::Offset<wire::TensorMsg> MessageWriter::tensor(const char* name, const Tensor& t, wire::DType dtype) {
  // The payload first, aligned to 64 bytes (force_align is honoured only by generated
  // Create*Direct, so align by hand) and encoded in place, then the small fields.
  const std::size_t bytes = encoded_bytes(dtype, t.numel());
  fbb_.ForceVectorAlignment(bytes, sizeof(uint8_t), kTensorAlignment);
  uint8_t* payload = nullptr;
  const auto data = fbb_.CreateUninitializedVector(bytes, sizeof(uint8_t), &payload);
  const float scale = encode_tensor(dtype, t.data(), t.numel(), payload);
  int64_t dims[kMaxRank];
  for (int i = 0; i < t.shape().rank(); ++i) dims[i] = t.shape()[i];
  const auto shape = fbb_.CreateVector(dims, static_cast<std::size_t>(t.shape().rank()));
  const auto n = fbb_.CreateString(name);
  return wire::CreateTensorMsg(fbb_, n, dtype, shape, scale, data);
}

std::span<const uint8_t> MessageWriter::finish(wire::Payload type, flatbuffers::Offset<void> payload) {
  fbb_.Finish(wire::CreateMessage(fbb_, type, payload, kWireFormat), wire::MessageIdentifier());
  return {fbb_.GetBufferPointer(), fbb_.GetSize()};
}

std::span<const uint8_t> MessageWriter::hello(const std::string& client_id, const std::array<uint8_t, 32>& hash,
                                              const std::string& token, uint32_t protocol_version,
                                              std::span<const wire::DType> dtypes, uint64_t resume_step) {
  fbb_.Clear();
  const auto id = fbb_.CreateString(client_id);
  const auto h = fbb_.CreateVector(hash.data(), hash.size());
  const auto d = fbb_.CreateVector(reinterpret_cast<const uint8_t*>(dtypes.data()), dtypes.size());
  const auto tok = fbb_.CreateString(token);
  wire::HelloBuilder b(fbb_);
  b.add_protocol_version(protocol_version);
  b.add_client_id(id);
  b.add_model_hash(h);
  b.add_dtypes(flatbuffers::Offset<flatbuffers::Vector<wire::DType>>(d.o));
  b.add_token(tok);
  b.add_resume_step(resume_step);
  return finish(wire::Payload::Hello, b.Finish().Union());
}

std::span<const uint8_t> MessageWriter::welcome(uint64_t session_id, uint32_t batch_size, uint32_t microbatches,
                                                uint64_t start_step, wire::DType dtype, uint32_t aggregate_every,
                                                uint32_t round, const std::string& next_token) {
  fbb_.Clear();
  const auto token = next_token.empty() ? flatbuffers::Offset<flatbuffers::String>() : fbb_.CreateString(next_token);
  return finish(wire::Payload::Welcome, wire::CreateWelcome(fbb_, session_id, batch_size, microbatches, start_step,
                                                            dtype, aggregate_every, round, token)
                                            .Union());
}

flatbuffers::Offset<flatbuffers::Vector<uint8_t>> MessageWriter::mask_bytes(const Tensor* mask) {
  if (mask == nullptr) return {};
  uint8_t* out = nullptr;
  const auto v = fbb_.CreateUninitializedVector(static_cast<std::size_t>(mask->numel()), &out);
  for (int64_t i = 0; i < mask->numel(); ++i) out[i] = (*mask)[i] != 0.0f ? 1 : 0;
  return v;
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::TensorMsg>>> MessageWriter::tensors(
    const NamedTensors& list) {
  std::vector<flatbuffers::Offset<wire::TensorMsg>> offsets;
  offsets.reserve(list.size());
  for (const auto& [name, t] : list) offsets.push_back(tensor(name.c_str(), t, wire::DType::F32));
  return fbb_.CreateVector(offsets);
}

std::span<const uint8_t> MessageWriter::front_weights(uint32_t round, uint64_t samples, const NamedTensors& list,
                                                      bool final) {
  fbb_.Clear();
  const auto t = tensors(list);
  return finish(wire::Payload::FrontWeights, wire::CreateFrontWeights(fbb_, round, samples, t, final).Union());
}

std::span<const uint8_t> MessageWriter::aggregated(uint32_t round, uint32_t edges, uint64_t samples,
                                                   const NamedTensors& list) {
  fbb_.Clear();
  const auto t = tensors(list);
  return finish(wire::Payload::Aggregated, wire::CreateAggregated(fbb_, round, edges, samples, t).Union());
}

std::span<const uint8_t> MessageWriter::forward(uint64_t step, uint32_t microbatch, uint64_t weight_version,
                                                const Tensor& activations, std::span<const int32_t> labels,
                                                uint32_t step_samples, uint32_t step_microbatches,
                                                wire::DType dtype, float lr_scale, bool checkpoint, const Tensor* mask) {
  fbb_.Clear();
  const auto m = mask_bytes(mask);
  const auto t = tensor("activations", activations, dtype);
  // No labels (a U-shaped edge keeps them): the field is absent, not empty.
  const auto l = labels.empty() ? flatbuffers::Offset<flatbuffers::Vector<int32_t>>()
                                : fbb_.CreateVector(labels.data(), labels.size());
  return finish(wire::Payload::Forward, wire::CreateForward(fbb_, step, microbatch, weight_version, t, l,
                                                            step_samples, step_microbatches, lr_scale,
                                                            checkpoint, m)
                                            .Union());
}

std::span<const uint8_t> MessageWriter::backward(uint64_t step, uint32_t microbatch, const Tensor& gradients,
                                                 float loss, wire::DType dtype,
                                                 uint64_t weight_version) {
  fbb_.Clear();
  const auto t = tensor("gradients", gradients, dtype);
  return finish(wire::Payload::Backward, wire::CreateBackward(fbb_, step, microbatch, t, loss, weight_version).Union());
}

std::span<const uint8_t> MessageWriter::eval_forward(uint64_t batch_id, const Tensor& activations,
                                                     std::span<const int32_t> labels, wire::DType dtype,
                                                     const Tensor* mask) {
  fbb_.Clear();
  const auto m = mask_bytes(mask);
  const auto t = tensor("activations", activations, dtype);
  const auto l = labels.empty() ? flatbuffers::Offset<flatbuffers::Vector<int32_t>>()
                                : fbb_.CreateVector(labels.data(), labels.size());
  return finish(wire::Payload::EvalForward, wire::CreateEvalForward(fbb_, batch_id, t, l, m).Union());
}

std::span<const uint8_t> MessageWriter::middle_output(uint64_t step, uint32_t microbatch, const Tensor& activations,
                                                      wire::DType dtype, uint64_t weight_version) {
  fbb_.Clear();
  const auto t = tensor("activations", activations, dtype);
  return finish(wire::Payload::MiddleOutput,
                wire::CreateMiddleOutput(fbb_, step, microbatch, t, weight_version).Union());
}

std::span<const uint8_t> MessageWriter::middle_gradient(uint64_t step, uint32_t microbatch, const Tensor& gradients,
                                                        float loss, wire::DType dtype) {
  fbb_.Clear();
  const auto t = tensor("gradients", gradients, dtype);
  return finish(wire::Payload::MiddleGradient, wire::CreateMiddleGradient(fbb_, step, microbatch, t, loss).Union());
}

std::span<const uint8_t> MessageWriter::eval_middle_output(uint64_t batch_id, const Tensor& activations,
                                                           wire::DType dtype, double cloud_busy_s) {
  fbb_.Clear();
  const auto t = tensor("activations", activations, dtype);
  return finish(wire::Payload::EvalMiddleOutput,
                wire::CreateEvalMiddleOutput(fbb_, batch_id, t, cloud_busy_s).Union());
}

std::span<const uint8_t> MessageWriter::eval_result(uint64_t batch_id, uint32_t correct, uint32_t count,
                                                    double loss_sum, double cloud_busy_s) {
  fbb_.Clear();
  return finish(wire::Payload::EvalResult,
                wire::CreateEvalResult(fbb_, batch_id, correct, count, loss_sum, cloud_busy_s).Union());
}

std::span<const uint8_t> MessageWriter::error(wire::ErrorCode code, const std::string& text) {
  fbb_.Clear();
  const auto t = fbb_.CreateString(text);
  return finish(wire::Payload::Error, wire::CreateError(fbb_, code, t).Union());
}

std::span<const uint8_t> MessageWriter::bye(const std::string& reason) {
  fbb_.Clear();
  const auto r = fbb_.CreateString(reason);
  return finish(wire::Payload::Bye, wire::CreateBye(fbb_, r).Union());
}

Tensor read_tensor(const Frame& frame, const wire::TensorMsg* msg, const Shape& expected, const char* what,
                   wire::DType dtype, Tensor& decoded, WireError& error) {
  auto bad = [&](wire::ErrorCode code, const std::string& text) {
    error = {code, cat(what, ": ", text)};
    return Tensor();
  };
  if (!msg) return bad(wire::ErrorCode::BadTensor, "missing");
  if (msg->dtype() != dtype) {
    const auto d = static_cast<int>(msg->dtype());
    return bad(wire::ErrorCode::BadTensor,
               d > static_cast<int>(wire::DType::MAX)
                   ? cat("unknown dtype ", d)
                   : cat("dtype ", wire::EnumNameDType(msg->dtype()), " was not negotiated (this session uses ",
                         wire::EnumNameDType(dtype), ")"));
  }
  const auto* shape = msg->shape();
  auto dim = [&](flatbuffers::uoffset_t i) { return int64_at(*shape, i); };
  bool same = shape && static_cast<int>(shape->size()) == expected.rank();
  for (int i = 0; same && i < expected.rank(); ++i) same = dim(static_cast<flatbuffers::uoffset_t>(i)) == expected[i];
  if (!same) {
    std::string got = "[";
    for (flatbuffers::uoffset_t i = 0; shape && i < shape->size() && i < 8; ++i) got += cat(i ? ", " : "", dim(i));
    return bad(wire::ErrorCode::BadTensor, cat("shape ", got, "] differs from the expected ", expected.str()));
  }
  const auto* data = msg->data();
  const std::size_t want = encoded_bytes(dtype, expected.numel());
  if (!data || data->size() != want)
    return bad(wire::ErrorCode::BadTensor, cat("carries ", data ? data->size() : 0, " bytes, its shape needs ", want));
  const uint8_t* p = data->data();
  if (reinterpret_cast<std::uintptr_t>(p) % kTensorAlignment != 0)
    return bad(wire::ErrorCode::Malformed, "payload is not 64-byte aligned");
  if (dtype == wire::DType::F32) {
    const auto* values = reinterpret_cast<const float*>(p);
    for (int64_t i = 0, n = expected.numel(); i < n; ++i)
      if (!std::isfinite(values[i])) return bad(wire::ErrorCode::BadTensor, cat("non-finite value at element ", i));
    return Tensor::borrow(frame.owner(), values, expected);
  }
  sized(decoded, expected);
  std::string why;
  if (!decode_tensor(dtype, p, expected.numel(), msg->scale(), decoded.data(), why))
    return bad(wire::ErrorCode::BadTensor, why);
  return decoded;
}

Tensor read_tensor(const Frame& frame, const wire::TensorMsg* msg, const Shape& expected, const char* what,
                   WireError& error) {
  Tensor unused;
  return read_tensor(frame, msg, expected, what, wire::DType::F32, unused, error);
}

bool read_named_tensors(const Frame& frame,
                        const flatbuffers::Vector<flatbuffers::Offset<wire::TensorMsg>>* list,
                        const NamedTensors& expected, std::vector<Tensor>& out, WireError& error) {
  const std::size_t n = list ? list->size() : 0;
  if (n != expected.size()) {
    error = {wire::ErrorCode::BadTensor, cat("weights: ", n, " tensors given, the front shard has ", expected.size())};
    return false;
  }
  out.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const wire::TensorMsg* t = list->Get(static_cast<flatbuffers::uoffset_t>(i));
    const std::string& name = expected[i].first;
    if (!t->name() || t->name()->string_view() != name) {
      error = {wire::ErrorCode::BadTensor, cat("weights: tensor ", i, " is '", t->name() ? t->name()->str() : "",
                                               "', expected '", name, "'")};
      return false;
    }
    Tensor v = read_tensor(frame, t, expected[i].second.shape(), name.c_str(), error);
    if (!v.defined()) return false;
    out.push_back(std::move(v));
  }
  return true;
}

bool check_labels(const flatbuffers::Vector<int32_t>* labels, int64_t count, int32_t classes, WireError& error) {
  if (!labels || static_cast<int64_t>(labels->size()) != count) {
    error = {wire::ErrorCode::BadTensor,
             cat("labels: ", labels ? labels->size() : 0, " given for a micro-batch of ", count)};
    return false;
  }
  for (flatbuffers::uoffset_t i = 0; i < labels->size(); ++i)
    if (labels->Get(i) < 0 || labels->Get(i) >= classes) {
      error = {wire::ErrorCode::BadTensor, cat("labels: ", labels->Get(i), " at ", i, " is outside [0, ", classes, ")")};
      return false;
    }
  return true;
}

bool read_mask(const flatbuffers::Vector<uint8_t>* mask, int64_t count, int64_t tokens, Tensor& decoded,
               WireError& error) {
  if (tokens == 0) {
    if (mask == nullptr) return true;
    error = {wire::ErrorCode::BadTensor, "mask: this split's cloud shard reads no mask, and a message carrying one is "
                                         "refused (nothing of the input but a mask the cloud needs may leave)"};
    return false;
  }
  if (!mask || static_cast<int64_t>(mask->size()) != count * tokens) {
    error = {wire::ErrorCode::BadTensor, cat("mask: ", mask ? mask->size() : 0, " bytes given for ", count,
                                             " samples of ", tokens, " tokens")};
    return false;
  }
  const Shape shape{count, tokens};
  sized(decoded, shape);
  for (flatbuffers::uoffset_t i = 0; i < mask->size(); ++i) {
    const uint8_t b = mask->Get(i);
    if (b > 1) {
      error = {wire::ErrorCode::BadTensor, cat("mask: ", static_cast<int>(b), " at ", i, " is neither 0 nor 1")};
      return false;
    }
    decoded[i] = b;
  }
  return true;
}

bool check_window(uint64_t step, uint32_t microbatch, uint64_t expected_step, uint32_t microbatches,
                  WireError& error) {
  if (step == expected_step && microbatch < microbatches) return true;
  error = {wire::ErrorCode::OutOfWindow, cat("step ", step, " micro-batch ", microbatch, " is outside the window (step ",
                                             expected_step, ", micro-batches 0..", microbatches - 1, ")")};
  return false;
}

std::span<const uint8_t> MessageWriter::stage_hello(const StageHelloFields& f) {
  fbb_.Clear();
  const auto h = fbb_.CreateVector(f.plan_hash.data(), f.plan_hash.size());
  const auto schedule = fbb_.CreateString(f.schedule);
  const auto dtypes = fbb_.CreateVector(reinterpret_cast<const uint8_t*>(f.dtypes.data()), f.dtypes.size());
  const bool terms = std::any_of(f.terms.begin(), f.terms.end(), [](uint8_t b) { return b != 0; });
  const auto terms_hash = terms ? fbb_.CreateVector(f.terms.data(), f.terms.size())
                                : flatbuffers::Offset<flatbuffers::Vector<uint8_t>>();
  const auto text = [&](const std::string& t) { return t.empty() ? flatbuffers::Offset<flatbuffers::String>() : fbb_.CreateString(t); };
  const auto client_id = text(f.client_id), token = text(f.token), next_token = text(f.next_token);
  return finish(wire::Payload::StageHello,
                wire::CreateStageHello(fbb_, f.format, h, f.stage, f.stages, f.resume_step, f.member, f.epoch_steps,
                                       schedule, f.batch, f.microbatches,
                                       flatbuffers::Offset<flatbuffers::Vector<wire::DType>>(dtypes.o), terms_hash,
                                       client_id, token, next_token, f.ended.has_value(), f.ended.value_or(0))
                    .Union());
}

std::span<const uint8_t> MessageWriter::activations(const StepHeader& header, uint32_t stage, uint32_t microbatch,
                                                    uint64_t weight_version, const Tensor& activations,
                                                    std::span<const int32_t> labels, const Tensor* mask,
                                                    wire::DType dtype) {
  fbb_.Clear();
  const auto t = tensor("activations", activations, dtype);
  const auto l = labels.empty() ? flatbuffers::Offset<flatbuffers::Vector<int32_t>>()
                                : fbb_.CreateVector(labels.data(), labels.size());
  const auto m = mask_bytes(mask);
  return finish(wire::Payload::Activations,
                wire::CreateActivations(fbb_, stage, header.step, microbatch, weight_version, header.samples,
                                        header.microbatches, header.lr_scale, header.checkpoint, t, l, m,
                                        header.evaluation, header.evaluation_begin)
                    .Union());
}

std::span<const uint8_t> MessageWriter::evaluated(uint32_t stage, uint64_t step, uint32_t microbatch, float loss,
                                                  uint32_t correct) {
  fbb_.Clear();
  return finish(wire::Payload::Evaluated, wire::CreateEvaluated(fbb_, stage, step, microbatch, loss, correct).Union());
}

std::span<const uint8_t> MessageWriter::drain(uint32_t stage, uint64_t step, float lr_scale) {
  fbb_.Clear();
  return finish(wire::Payload::Drain, wire::CreateDrain(fbb_, stage, step, lr_scale).Union());
}

std::span<const uint8_t> MessageWriter::gradients(uint32_t stage, uint64_t step, uint32_t microbatch,
                                                  uint64_t weight_version, const Tensor& gradients, float loss,
                                                  uint32_t correct, wire::DType dtype) {
  fbb_.Clear();
  const auto t = tensor("gradients", gradients, dtype);
  return finish(wire::Payload::Gradients,
                wire::CreateGradients(fbb_, stage, step, microbatch, weight_version, t, loss, correct).Union());
}

}  // namespace tandem
