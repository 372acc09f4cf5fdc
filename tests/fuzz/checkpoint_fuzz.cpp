// Fuzzes checkpoint loading: decode_checkpoint on the bytes (as they are, and re-framed with a
// fresh checksum), restore_checkpoint into networks it might fit, and CheckpointStore reading.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/sha256.h"
#include "tests/fuzz/fuzz_setup.h"
#include "ports/files/atomic_file.h"
#include "ports/files/checkpoint_store.h"

using namespace tandem;

namespace {

// tests/fuzz/fuzz_setup.h's split model (Sgd) and a small one with batch norms, dropout and
// Adam, whose checkpoints carry buffers, counters and two optimizer states per parameter.
constexpr const char* kBnSpec = R"({ name: "fuzz-bn", inputs: [ { name: "image", shape: [8, 8, 1] } ], nodes: [
  { name: "conv1", op: "conv2d", inputs: ["image"], conv2d: { out_channels: 4, kernel: [3], padding: [1] } },
  { name: "bn1", op: "batch_norm", inputs: ["conv1"] },
  { name: "relu1", op: "relu", inputs: ["bn1"] },
  { name: "pool1", op: "max_pool2d", inputs: ["relu1"], pool: { kernel: [2] } },
  { name: "flatten", op: "flatten", inputs: ["pool1"] },
  { name: "drop", op: "dropout", inputs: ["flatten"], dropout: { p: 0.25 } },
  { name: "fc1", op: "linear", inputs: ["drop"], linear: { out_features: 4 } } ], cut: "pool1" })";

struct Targets {
  fuzz::Model& m = fuzz::model();
  ModelSpec bn_spec = parse_model_json(kBnSpec);
  Graph bn_graph = Graph::build(bn_spec);
  std::string dir;
};

Targets* targets = nullptr;

// The input's payload (the input itself unless it is a framed checkpoint) framed as
// encode_checkpoint frames it: "TDMCKPT1", its length, it, its SHA-256. Without this nearly
// every mutation would stop at the checksum, before the verifier and the tensor checks.
std::vector<uint8_t> reframed(const uint8_t* data, std::size_t size) {
  static constexpr char kMagic[8] = {'T', 'D', 'M', 'C', 'K', 'P', 'T', '1'};
  const bool framed = size >= 8 + 8 + 32 && std::memcmp(data, kMagic, 8) == 0;
  const uint8_t* payload = framed ? data + 16 : data;
  const std::size_t n = framed ? size - 16 - 32 : size;
  std::vector<uint8_t> out(kMagic, kMagic + 8);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i)));
  out.insert(out.end(), payload, payload + n);
  const auto digest = sha256(payload, n);
  out.insert(out.end(), digest.begin(), digest.end());
  return out;
}

void decode_and_restore(std::span<const uint8_t> bytes) {
  try {
    const CheckpointData d = decode_checkpoint(bytes);
    // Whatever decodes either fits a network exactly or is refused before anything changes.
    Network whole(targets->m.graph, *targets->m.backend, 1);
    Sgd sgd(whole.params(), fuzz::Model::sgd());
    try {
      restore_checkpoint(d, whole, &sgd);
    } catch (const Error&) {
    }
    Network back(targets->m.shards.second, *targets->m.backend, 1);
    try {
      restore_checkpoint(d, back, nullptr);
    } catch (const Error&) {
    }
    Network bn(targets->bn_graph, *targets->m.backend, 1);
    OptimizerOptions adam;
    adam.kind = "adam";
    auto opt = make_optimizer(bn.params(), adam);
    try {
      restore_checkpoint(d, bn, opt.get());
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  targets = new Targets;
  char tmpl[] = "/tmp/tandem-checkpoint-fuzz-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  targets->dir = tmpl;
  std::atexit([] { std::filesystem::remove_all(targets->dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  decode_and_restore(bytes);
  decode_and_restore(reframed(data, size));
  // The same bytes as the newest file of a checkpoint folder, read without and with a key.
  try {
    const CheckpointStore plain(targets->dir, "fuzz");
    write_file_atomic(plain.path_of(7), bytes);
    (void)plain.load_step(7);
  } catch (const Error&) {
  }
  try {
    AesKey key{};
    key[0] = 1;
    const CheckpointStore sealed(targets->dir, "fuzz", key);
    (void)sealed.load_step(7);  // (load_latest would say on stderr why it refuses each file)
  } catch (const Error&) {
  }
  return 0;
}
