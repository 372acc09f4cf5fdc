#include "core/wire/egress_audit.h"

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "core/flatbuffer_read.h"
#include "core/sha256.h"
#include "core/wire/frame.h"
#include "core/wire/tensor_codec.h"

namespace tandem {
namespace {

constexpr std::string_view kHashMember = ",\"hash\":\"";

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string EgressAudit::payload_hash(std::span<const uint8_t> bytes) const {
  const auto h = hasher_ ? hasher_(bytes) : sha256(bytes.data(), bytes.size());
  return to_hex(h.data(), h.size());
}

std::string EgressAudit::tensor_json(const wire::TensorMsg* t) const {
  if (!t) return "null";
  std::string shape;
  if (t->shape())
    for (flatbuffers::uoffset_t k = 0; k < t->shape()->size(); ++k) {
      if (!shape.empty()) shape += ",";
      shape += std::to_string(int64_at(*t->shape(), k));
    }
  const std::span<const uint8_t> data = t->data() ? std::span<const uint8_t>(t->data()->data(), t->data()->size())
                                                  : std::span<const uint8_t>();
  return cat("{\"name\":\"", json_escape(t->name() ? t->name()->str() : ""), "\",\"dtype\":\"", dtype_name(t->dtype()),
             "\",\"shape\":[", shape, "],\"bytes\":", data.size(), ",\"sha256\":\"", payload_hash(data), "\"}");
}

std::string EgressAudit::mask_json(const flatbuffers::Vector<uint8_t>* mask) const {
  if (!mask) return "";
  return cat(",\"mask\":", mask->size(), ",\"mask_sha256\":\"",
             payload_hash(std::span<const uint8_t>(mask->data(), mask->size())), "\"");
}

std::string EgressAudit::labels_json(std::span<const int32_t> labels) const {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(labels.data()), labels.size() * 4);
  return cat(",\"labels\":", labels.size(), ",\"labels_sha256\":\"", payload_hash(bytes), "\"");
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

bool egress_line_hashes(const std::string& line, std::string& claimed, std::string& computed) {
  const std::size_t at = line.rfind(kHashMember);
  if (at == std::string::npos || line.size() < at + kHashMember.size() + 66) return false;
  claimed = line.substr(at + kHashMember.size(), 64);
  if (line.compare(at + kHashMember.size() + 64, std::string::npos, "\"}") != 0) return false;
  const auto h = sha256(line.data(), at);
  computed = to_hex(h.data(), h.size());
  return true;
}

EgressAudit::EgressAudit(Sink sink, std::string prev, Hasher hasher)
    : sink_(std::move(sink)), hasher_(std::move(hasher)), prev_(std::move(prev)) {}

void EgressAudit::append(std::string body) {
  std::string line = cat("{\"seq\":", seq_++, ",\"unix_ms\":", unix_ms(), ",", body, ",\"prev\":\"", prev_, "\"");
  const auto h = sha256(line.data(), line.size());
  prev_ = to_hex(h.data(), h.size());
  line += cat(kHashMember, prev_, "\"}");
  sink_(line);
}

void EgressAudit::begin_run(const std::string& client, const std::string& model, const std::string& cut,
                            const std::array<uint8_t, 32>& model_hash) {
  seq_ = 0;
  messages_ = bytes_ = 0;
  by_type_.clear();
  open_ = true;
  append(cat("\"type\":\"run\",\"client\":\"", json_escape(client), "\",\"model\":\"", json_escape(model),
             "\",\"cut\":\"", json_escape(cut), "\",\"model_hash\":\"", to_hex(model_hash.data(), model_hash.size()),
             "\""));
}

void EgressAudit::record(std::span<const uint8_t> message) {
  auto labels_of = [this](const flatbuffers::Vector<int32_t>* labels) {
    return labels ? labels_json(std::span<const int32_t>(labels->data(), labels->size())) : std::string();
  };
  // Our own message, copied so the verifier reads it aligned; described by what it carries.
  Frame frame = Frame::copy_of(message.data(), message.size());
  WireError err;
  const wire::Message* m = verify_frame(frame, message.size() + 1, err);
  const std::string type = m ? wire::EnumNamePayload(m->payload_type()) : "unknown";
  // Each payload's hash (tensors, labels) rather than the whole message's: hashing is most
  // of the audit's cost, and the rest of a message is the fields logged here.
  std::string body = cat("\"type\":\"", type, "\",\"bytes\":", message.size());
  if (m) switch (m->payload_type()) {
      case wire::Payload::Hello: {
        const auto* h = m->payload_as_Hello();
        body += cat(",\"client\":\"", json_escape(h->client_id() ? h->client_id()->str() : ""),
                    "\",\"token\":", h->token() && h->token()->size() ? "true" : "false",
                    ",\"resume_step\":", h->resume_step());
        break;
      }
      case wire::Payload::Forward: {
        const auto* f = m->payload_as_Forward();
        body += cat(",\"step\":", f->step(), ",\"microbatch\":", f->microbatch(), ",\"tensors\":[",
                    tensor_json(f->activations()), "]", labels_of(f->labels()), mask_json(f->mask()));
        break;
      }
      case wire::Payload::EvalForward: {
        const auto* f = m->payload_as_EvalForward();
        body += cat(",\"batch\":", f->batch_id(), ",\"tensors\":[", tensor_json(f->activations()), "]",
                    labels_of(f->labels()), mask_json(f->mask()));
        break;
      }
      case wire::Payload::StageHello: {  // a pipeline's stage (pipeline/stage_peer.h)
        const auto* h = m->payload_as_StageHello();
        body += cat(",\"stage\":", h->stage(), ",\"stages\":", h->stages(), ",\"resume_step\":", h->resume_step());
        break;
      }
      case wire::Payload::Activations: {
        const auto* a = m->payload_as_Activations();
        body += cat(",\"stage\":", a->stage(), ",\"step\":", a->step(), ",\"microbatch\":", a->microbatch(),
                    a->evaluation() ? cat(",\"evaluation_begin\":", a->evaluation_begin()) : std::string(),
                    ",\"tensors\":[", tensor_json(a->tensor()), "]", labels_of(a->labels()), mask_json(a->mask()));
        break;
      }
      case wire::Payload::Evaluated: {
        const auto* e = m->payload_as_Evaluated();
        body += cat(",\"stage\":", e->stage(), ",\"step\":", e->step(), ",\"microbatch\":", e->microbatch(),
                    ",\"loss\":", e->loss(), ",\"correct\":", e->correct());
        break;
      }
      case wire::Payload::Drain: {  // the asynchronous schedule's step in flight, backed up
        const auto* d = m->payload_as_Drain();
        body += cat(",\"stage\":", d->stage(), ",\"step\":", d->step(), ",\"lr_scale\":", d->lr_scale());
        break;
      }
      case wire::Payload::Gradients: {
        const auto* g = m->payload_as_Gradients();
        body += cat(",\"stage\":", g->stage(), ",\"step\":", g->step(), ",\"microbatch\":", g->microbatch(),
                    ",\"tensors\":[", tensor_json(g->tensor()), "],\"loss\":", g->loss(), ",\"correct\":", g->correct());
        break;
      }
      case wire::Payload::MiddleGradient: {  // U-shaped: the gradient of the middle's output
        const auto* g = m->payload_as_MiddleGradient();
        body += cat(",\"step\":", g->step(), ",\"microbatch\":", g->microbatch(), ",\"tensors\":[",
                    tensor_json(g->gradients()), "]");
        break;
      }
      case wire::Payload::FrontWeights: {
        const auto* f = m->payload_as_FrontWeights();
        std::string tensors;
        if (f->tensors())
          for (const auto* t : *f->tensors()) { if (!tensors.empty()) tensors += ","; tensors += tensor_json(t); }
        body += cat(",\"round\":", f->round(), ",\"samples\":", f->samples(), ",\"tensors\":[", tensors, "]");
        break;
      }
      default:
        break;
    }
  ++messages_;
  bytes_ += message.size();
  auto& [count, bytes] = by_type_[type];
  ++count;
  bytes += message.size();
  append(std::move(body));
}

std::string EgressAudit::finish(const std::string& outcome) {
  if (!open_) return prev_;
  open_ = false;
  std::string kinds;
  for (const auto& [type, cb] : by_type_)
    kinds += cat(kinds.empty() ? "" : ",", "\"", type, "\":{\"messages\":", cb.first, ",\"bytes\":", cb.second, "}");
  append(cat("\"type\":\"summary\",\"outcome\":\"", json_escape(outcome), "\",\"messages\":", messages_,
             ",\"bytes\":", bytes_, ",\"by_type\":{", kinds, "}"));
  return prev_;
}

}  // namespace tandem
