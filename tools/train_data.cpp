#include "tools/train_data.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.h"
#include "data/idx_dataset.h"

namespace tandem {

TrainingSets load_training_sets(const CliArgs& args, const Graph& graph) {
  const std::string data = args.str("data", "fashion-mnist");
  TrainingSets sets;
  if (data == "fashion-mnist") {
    std::fprintf(stderr, "loading Fashion-MNIST from %s\n", fashion_mnist_dir().c_str());
    LabelledImages train_images = load_fashion_mnist(true, args.integer("limit", 0, 0));
    LabelledImages test_images = load_fashion_mnist(false, args.integer("test-limit", 0, 0));
    const Shape& in_shape = graph.inputs().at(0).shape;
    if (graph.inputs().size() != 1 || train_images.images.shape().item_numel() != in_shape.numel())
      fail("cli", cat("the model's inputs are not one image of Fashion-MNIST's size (its first, '",
                      graph.inputs()[0].name, "', is ", in_shape.str(), "): give its data with --data DIR"));
    const int64_t n_train = train_images.images.shape()[0], n_test = test_images.images.shape()[0];
    sets.train = {{train_images.images.reshape(in_shape.batched(n_train))}, std::move(train_images.labels)};
    sets.test = {{test_images.images.reshape(in_shape.batched(n_test))}, std::move(test_images.labels)};
  } else {
    std::fprintf(stderr, "loading the data set in %s\n", data.c_str());
    sets.train = read_tensor_dataset(data + "/train.safetensors", graph.inputs(), args.integer("limit", 0, 0));
    sets.test = read_tensor_dataset(data + "/test.safetensors", graph.inputs(), args.integer("test-limit", 0, 0));
  }
  return sets;
}

LabelledInputs every_nth(const LabelledInputs& set, uint32_t first, uint32_t count) {
  const auto share = static_cast<int64_t>(set.labels.size() / count);
  LabelledInputs out;
  for (const Tensor& t : set.inputs) {
    const int64_t item = t.shape().item_numel();
    Tensor rows = Tensor::empty(t.shape().resize_batch(share));
    for (int64_t j = 0; j < share; ++j)
      std::copy_n(t.data() + (j * count + first) * item, item, rows.data() + j * item);
    out.inputs.push_back(std::move(rows));
  }
  for (int64_t j = 0; j < share; ++j) out.labels.push_back(set.labels[static_cast<std::size_t>(j * count + first)]);
  return out;
}

EpochBatches::EpochBatches(const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed)
    : graph_(graph), set_(set), batch_(batch), rng_(seed ^ 0x5eedULL) {
  order_.resize(set.labels.size());
  std::iota(order_.begin(), order_.end(), 0);
  for (const GraphInput& in : graph.inputs()) inputs_.push_back(Tensor::empty(in.shape.batched(batch)));
  labels_.resize(static_cast<std::size_t>(batch));
}

void EpochBatches::shuffle() {
  for (int64_t i = samples() - 1; i > 0; --i)
    std::swap(order_[static_cast<std::size_t>(i)], order_[rng_.below(static_cast<uint64_t>(i + 1))]);
}

const int32_t* EpochBatches::labels(int64_t begin) {
  const int64_t count = std::min(batch_, samples() - begin);
  for (int64_t j = 0; j < count; ++j)
    labels_[static_cast<std::size_t>(j)] = set_.labels[static_cast<std::size_t>(order_[static_cast<std::size_t>(begin + j)])];
  return labels_.data();
}

std::vector<Tensor> EpochBatches::rows(int64_t begin, const int32_t*& labels) {
  const int64_t count = std::min(batch_, samples() - begin);
  std::vector<Tensor> x;
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    const int64_t item = graph_.inputs()[k].shape.numel();
    for (int64_t j = 0; j < count; ++j)
      std::copy_n(set_.inputs[k].data() + order_[static_cast<std::size_t>(begin + j)] * item, item,
                  inputs_[k].data() + j * item);
    x.push_back(count == batch_ ? inputs_[k] : inputs_[k].slice_batch(0, count));
  }
  labels = this->labels(begin);
  return x;
}

StepStats evaluate_in_batches(
    const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed,
    const std::function<StepStats(std::span<const Tensor> rows, const int32_t* labels, int64_t begin)>& evaluate) {
  StepStats total;
  if (set.labels.empty()) return total;
  EpochBatches batches(graph, set, batch, seed);
  for (int64_t b = 0; b < batches.samples(); b += batch) {
    const int32_t* labels = nullptr;
    const std::vector<Tensor> rows = batches.rows(b, labels);
    const StepStats st = evaluate(rows, labels, b);
    total.loss_sum += st.loss_sum;
    total.correct += st.correct;
    total.samples += st.samples;
  }
  return total;
}

StepLabels::StepLabels(const Graph& graph, const LabelledInputs& set, int64_t batch, uint64_t seed)
    : graph_(graph), set_(set), batch_(batch), seed_(seed) {}

std::span<const int32_t> StepLabels::of(uint64_t step) {
  const auto per_epoch = static_cast<uint64_t>((static_cast<int64_t>(set_.labels.size()) + batch_ - 1) / batch_);
  if (per_epoch == 0) fail("stage", "the training set is empty: check data and limit");
  const auto epoch = static_cast<int64_t>(step / per_epoch);
  if (!batches_ || epoch < epoch_) {  // from the start: the shuffles are a sequence
    batches_ = std::make_unique<EpochBatches>(graph_, set_, batch_, seed_);
    epoch_ = -1;
  }
  for (; epoch_ < epoch; ++epoch_) batches_->shuffle();
  const int64_t begin = static_cast<int64_t>(step % per_epoch) * batch_;
  const int64_t count = std::min(batch_, batches_->samples() - begin);
  const int32_t* labels = batches_->labels(begin);
  labels_.assign(labels, labels + count);
  return labels_;
}

}  // namespace tandem
