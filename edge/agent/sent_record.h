// tandem-edge --record-sent FILE: the training activations this edge sent at the end of its
// run's last epoch (the last N samples: those the final weights computed, the strongest case
// for an attacker holding them), as the cloud received them (cut noise and the wire codec
// applied), decoded to f32, with the training-set index of each sample: a safetensors file with "activations"
// [n, values] (F32) and "samples" [n] (I64). For tests and benchmarks that study what leaves
// the edge (bench/privacy/inversion.sh attacks these rows, not activations it recomputes).
// Metadata: "epoch", and "sample_shape", a row's shape in tandem's layout (channels last, as
// on the wire: "[7,7,64]" where PyTorch's is [64, 7, 7]).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class SentRecord {
 public:
  // Keeps the last `limit` samples sent in epoch `epoch`.
  SentRecord(std::string path, int64_t epoch, int64_t limit);
  // EventEdgeConfig::on_training_forward. Throws Error on a message it cannot read (its own).
  void on_forward(int64_t epoch, std::span<const int64_t> samples, std::span<const uint8_t> message);
  // Writes the file (atomically); says what it holds on stderr.
  void write() const;

 private:
  std::string path_;
  int64_t epoch_, limit_;
  int64_t width_ = -1;  // values a sample
  std::string sample_shape_;
  // A ring of `limit` rows: `seen_` samples so far, the oldest kept at seen_ % limit once full.
  std::vector<float> rows_;
  std::vector<int64_t> samples_;
  int64_t seen_ = 0;
};

}  // namespace tandem
