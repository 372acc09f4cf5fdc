// Label leakage from what the cloud receives (issue 18, attack b): trains the sample model
// in-process with the real edge and cloud sessions and their encoded messages, and plays an
// honest-but-curious cloud on every message the edge sends: with an ordinary cut it reads the
// labels from the Forwards; U-shaped it runs Li et al.'s (2021) norm and direction attacks on
// the gradients the edge sends up (MiddleGradient), with and without noise on them. Printed
// beside each: the test accuracy the setting reached.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "cli/command_line.h"
#include "cloud/session/back_shard_trainer.h"
#include "cloud/session/cloud_session.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/microbatch.h"
#include "core/privacy/cut_noise.h"
#include "data/epoch_order.h"
#include "data/idx_dataset.h"
#include "edge/session/edge_session.h"

namespace tandem {
namespace {

constexpr const char* kDetails = R"(
  Trains the model once with the ordinary cut A (the cloud reads the labels from each
  Forward), once U-shaped at A,B without noise, once for each of --sigmas with --grad-clip C
  and --grad-noise sigma on the gradients the edge sends up, and once for each of
  --label-sigmas with --label-noise sigma (noise on the loss gradient at the logits, for what
  goes up). For each: the test accuracy, and the curious cloud's attacks on what it received, per step: the norm attack's and the
  direction attack's AUC on classes P and Q (the direction attack knows one sample of P per
  step), and the ten-class attack's accuracy (one known sample per class per step; every
  other sample takes the class of the known one its gradient is closest to in cosine).
)";

struct Setting {
  std::string name, cut;
  float sigma = -1.0f;        // < 0: no noise on the gradients sent up (--grad-noise)
  float label_sigma = -1.0f;  // < 0: no label noise (--label-noise)
};

struct Outcome {
  double accuracy = 0.0;
  double norm_auc = 0.0, direction_auc = 0.0, ten_class = 0.0;  // -1: not measured
  int64_t labels_read = 0, labels_right = 0;                     // ordinary cut: from the Forwards
  double median_grad_norm = 0.0;  // per-sample gradient of its own loss, as it left
  int64_t steps_scored = 0;
};

// P(score of a positive > score of a negative), ties counting a half.
double auc(const std::vector<double>& positive, const std::vector<double>& negative) {
  if (positive.empty() || negative.empty()) return -1.0;
  double wins = 0.0;
  for (double p : positive)
    for (double n : negative) wins += p > n ? 1.0 : p == n ? 0.5 : 0.0;
  return wins / (static_cast<double>(positive.size()) * static_cast<double>(negative.size()));
}

double cosine(const float* a, const float* b, int64_t d) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0.0 && bb > 0.0 ? ab / std::sqrt(aa * bb) : 0.0;
}

// The attacks on one step's gradients (rows of `d`, in the step's sample order) against the
// true labels; adds to the running sums.
struct Attacks {
  int32_t p = 0, q = 1;
  double norm_sum = 0.0, direction_sum = 0.0;
  int64_t norm_steps = 0, direction_steps = 0, ten_right = 0, ten_total = 0;
  std::vector<double> norms;

  void score_step(const std::vector<float>& rows, int64_t d, const std::vector<int32_t>& labels, float samples) {
    const auto n = static_cast<int64_t>(labels.size());
    std::vector<double> norm_p, norm_q, dir_p, dir_q;
    int64_t ref_p = -1;
    std::vector<int64_t> refs(10, -1);
    for (int64_t i = 0; i < n; ++i) {
      const float* g = rows.data() + i * d;
      double sq = 0.0;
      for (int64_t j = 0; j < d; ++j) sq += static_cast<double>(g[j]) * g[j];
      const double norm = std::sqrt(sq);
      norms.push_back(norm * samples);
      const int32_t y = labels[static_cast<std::size_t>(i)];
      if (y == p) norm_p.push_back(norm);
      if (y == q) norm_q.push_back(norm);
      if (y == p && ref_p < 0) ref_p = i;
      if (y >= 0 && y < 10 && refs[static_cast<std::size_t>(y)] < 0) refs[static_cast<std::size_t>(y)] = i;
    }
    if (const double a = auc(norm_p, norm_q); a >= 0.0) {
      norm_sum += a;
      ++norm_steps;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t y = labels[static_cast<std::size_t>(i)];
      const float* g = rows.data() + i * d;
      if (ref_p >= 0 && i != ref_p && (y == p || y == q))
        (y == p ? dir_p : dir_q).push_back(cosine(g, rows.data() + ref_p * d, d));
      if (std::find(refs.begin(), refs.end(), i) != refs.end()) continue;  // a known sample
      int32_t best = -1;
      double best_cos = -2.0;
      for (int32_t c = 0; c < 10; ++c) {
        const int64_t r = refs[static_cast<std::size_t>(c)];
        if (r < 0) continue;
        const double cs = cosine(g, rows.data() + r * d, d);
        if (cs > best_cos) best_cos = cs, best = c;
      }
      ten_right += best == y;
      ++ten_total;
    }
    if (const double a = auc(dir_p, dir_q); a >= 0.0) {
      direction_sum += a;
      ++direction_steps;
    }
  }
};

Outcome run(const ModelSpec& spec, const Setting& s, const CliArgs& args, const LabelledImages& train,
            const LabelledImages& test) {
  const Graph graph = Graph::build(spec);
  const bool u = u_shaped_cut(s.cut);
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  auto edge_backend = make_backend(preferred_backend("xnnpack"));
  auto cloud_backend = make_backend(preferred_backend("onednn"));
  auto reference = make_backend("reference");
  const auto [front_graph, back_graph] = graph.split(s.cut);
  Network front(front_graph, *edge_backend, seed), back(back_graph, *cloud_backend, seed);
  std::unique_ptr<Network> tail;
  if (u) tail = std::make_unique<Network>(graph.tail(s.cut), *edge_backend, seed);
  for (Network* n : {&front, &back, tail.get()})
    if (n) init_from_whole_model(graph, seed, *n, *reference);
  const OptimizerOptions opt = args.optimizer_options();
  std::vector<Param*> edge_params = front.params();
  if (tail) edge_params.insert(edge_params.end(), tail->params().begin(), tail->params().end());
  auto edge_opt = make_optimizer(edge_params, opt);
  auto back_opt = make_optimizer(back.params(), opt);
  BackShardTrainer shard(back, *back_opt);
  constexpr uint32_t kBatch = 64, kMicro = 4;
  const auto hash = model_hash(spec, s.cut);
  CloudSessionConfig cc;
  cc.model_hash = hash;
  cc.batch_size = kBatch;
  cc.microbatches = kMicro;
  cc.classes = static_cast<int32_t>(graph.classes());
  cc.cut = s.cut;
  CloudSession cloud(shard, cc);
  EdgeSession edge(front, *edge_opt, kMicro, hash, "curious-cloud-bench");
  if (tail) edge.set_tail(tail.get());
  std::unique_ptr<CutNoise> noise;
  if (s.sigma >= 0.0f) {
    noise = std::make_unique<CutNoise>(static_cast<float>(args.number("grad-clip", 1.0)), s.sigma, seed + 99);
    edge.set_gradient_noise(noise.get());
  }
  std::unique_ptr<CutNoise> label_noise;
  if (s.label_sigma >= 0.0f) {  // as tandem-edge --label-noise sets it up (EventEdge)
    const float bound = std::sqrt(2.0f * static_cast<float>(graph.output_groups()));
    label_noise = std::make_unique<CutNoise>(bound, s.label_sigma / bound, seed + 101);
    edge.set_label_noise(label_noise.get());
  }
  auto deliver = [&](std::span<const uint8_t> bytes) {
    CloudReply r = cloud.handle(Frame::copy_of(bytes.data(), bytes.size()));
    cloud.finish_step();
    if (r.close) fail("bench", cat(s.name, ": the cloud closed the session: ",
                                   wire::GetMessage(r.bytes.data())->payload_as_Error()->text()->str()));
    return Frame::copy_of(r.bytes.data(), r.bytes.size());
  };
  WireError err;
  if (!edge.on_welcome(deliver(edge.hello()), err)) fail("bench", err.text);

  Outcome out;
  Attacks attacks;
  const auto classes = args.str("classes", "0,1");
  attacks.p = std::stoi(classes.substr(0, classes.find(',')));
  attacks.q = std::stoi(classes.substr(classes.find(',') + 1));
  const int64_t n = train.images.shape()[0], item = train.images.shape().item_numel();
  const int64_t epochs = args.integer("epochs", 2, 1);
  Tensor images;
  std::vector<int32_t> labels;
  std::vector<float> rows;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    const std::vector<int64_t> order = epoch_order(n, seed, epoch);
    for (int64_t begin = 0; begin < n; begin += kBatch) {
      const int64_t count = std::min<int64_t>(kBatch, n - begin);
      if (!images.defined() || images.shape()[0] != count) images = Tensor::empty(graph.inputs()[0].shape.batched(count));
      labels.resize(static_cast<std::size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t src = order[static_cast<std::size_t>(begin + i)];
        std::copy_n(train.images.data() + src * item, item, images.data() + i * item);
        labels[static_cast<std::size_t>(i)] = train.labels[static_cast<std::size_t>(src)];
      }
      const int k = edge.begin_step(images, labels.data());
      std::vector<Frame> replies;
      for (int mb = 0; mb < k; ++mb) {
        const std::span<const uint8_t> fwd = edge.forward(mb);
        // The curious cloud reads what a Forward carries.
        const wire::Forward* f = wire::GetMessage(fwd.data())->payload_as_Forward();
        if (f->labels()) {
          const int64_t first = microbatch_range(count, k, mb).begin;
          for (uint32_t i = 0; i < f->labels()->size(); ++i) {
            ++out.labels_read;
            out.labels_right += f->labels()->Get(i) == labels[static_cast<std::size_t>(first + i)];
          }
        }
        replies.push_back(deliver(fwd));
      }
      int64_t d = 0;
      std::vector<Frame> backwards;
      for (int mb = 0; mb < k; ++mb) {
        bool done = false;
        std::span<const uint8_t> reply;
        if (!edge.on_step_message(replies[static_cast<std::size_t>(mb)], err, done, reply)) fail("bench", err.text);
        if (reply.empty()) continue;  // an ordinary cut: that was the Backward
        // U-shaped: the curious cloud keeps the gradient rows that came up.
        const Frame up = Frame::copy_of(reply.data(), reply.size());
        const wire::MiddleGradient* g = wire::GetMessage(up.data())->payload_as_MiddleGradient();
        const int64_t m = microbatch_range(count, k, mb).count;
        Tensor rows_mb = read_tensor(up, g->gradients(), tail->graph().inputs()[0].shape.batched(m), "gradients", err);
        if (!rows_mb.defined()) fail("bench", err.text);
        d = rows_mb.shape().item_numel();
        rows.insert(rows.end(), rows_mb.data(), rows_mb.data() + rows_mb.numel());
        backwards.push_back(deliver(reply));
      }
      for (const Frame& b : backwards) {
        bool done = false;
        std::span<const uint8_t> reply;
        if (!edge.on_step_message(b, err, done, reply)) fail("bench", err.text);
      }
      if (u) {
        attacks.score_step(rows, d, labels, static_cast<float>(count));
        rows.clear();
      }
    }
    std::fprintf(stderr, "  %s: epoch %lld of %lld trained\n", s.name.c_str(), static_cast<long long>(epoch),
                 static_cast<long long>(epochs));
  }
  int64_t correct = 0;
  const int64_t tn = test.images.shape()[0];
  for (int64_t begin = 0; begin < tn; begin += 500) {
    const int64_t count = std::min<int64_t>(500, tn - begin);
    const Frame r = deliver(edge.eval_forward(static_cast<uint64_t>(begin), test.images.slice_batch(begin, count),
                                              test.labels.data() + begin, count));
    EdgeSession::EvalResult result;
    if (!edge.on_eval_result(r, err, result)) fail("bench", err.text);
    correct += result.correct;
  }
  out.accuracy = static_cast<double>(correct) / static_cast<double>(tn);
  if (u) {
    out.norm_auc = attacks.norm_steps ? attacks.norm_sum / static_cast<double>(attacks.norm_steps) : -1.0;
    out.norm_auc = std::max(out.norm_auc, 1.0 - out.norm_auc);  // the attacker may take either side
    out.direction_auc = attacks.direction_steps ? attacks.direction_sum / static_cast<double>(attacks.direction_steps) : -1.0;
    out.ten_class = attacks.ten_total ? static_cast<double>(attacks.ten_right) / static_cast<double>(attacks.ten_total) : -1.0;
    std::nth_element(attacks.norms.begin(), attacks.norms.begin() + static_cast<std::ptrdiff_t>(attacks.norms.size() / 2),
                     attacks.norms.end());
    out.median_grad_norm = attacks.norms.empty() ? 0.0 : attacks.norms[attacks.norms.size() / 2];
    out.steps_scored = attacks.direction_steps;
  } else {  // no gradient attack needed: the labels came with the activations (as read, above)
    out.norm_auc = out.direction_auc = -1.0;
    out.ten_class = out.labels_read ? static_cast<double>(out.labels_right) / static_cast<double>(out.labels_read) : -1.0;
  }
  return out;
}

int main_impl(const CliArgs& args) {
  const ModelSpec spec = load_model_spec(args.required("model"));
  const LabelledImages train = load_fashion_mnist(true, args.integer("limit", 0, 0));
  const LabelledImages test = load_fashion_mnist(false, args.integer("test-limit", 0, 0));
  std::vector<Setting> settings = {{"ordinary cut", args.str("cut", "pool2")},
                                   {"U-shaped", args.str("u-cut", "pool2,relu3")}};
  auto each = [](const std::string& list, const std::function<void(const std::string&)>& f) {
    for (std::size_t at = 0; !list.empty();) {
      const std::size_t comma = list.find(',', at);
      f(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  };
  const std::string u_cut = args.str("u-cut", "pool2,relu3");
  each(args.str("sigmas", "0.5,1"),
       [&](const std::string& one) { settings.push_back({cat("U-shaped, grad noise ", one), u_cut, std::stof(one)}); });
  each(args.str("label-sigmas", "2,4"), [&](const std::string& one) {
    settings.push_back({cat("U-shaped, label noise ", one), u_cut, -1.0f, std::stof(one)});
  });
  const std::string classes = args.str("classes", "0,1");
  std::printf("label leakage: %s, %lld training samples x %lld epochs, batch 64, K 4; attacks on classes %s; "
              "grad clip %.3g\n",
              spec.name.c_str(), static_cast<long long>(train.images.shape()[0]),
              static_cast<long long>(args.integer("epochs", 2, 1)), classes.c_str(), args.number("grad-clip", 1.0));
  std::printf("%-28s %9s %9s %9s %10s %12s\n", "setting", "test acc", "norm AUC", "dir AUC", "10-class", "grad norm");
  for (const Setting& s : settings) {
    const Outcome o = run(spec, s, args, train, test);
    auto score = [](double v) { return v < 0 ? std::string("n/a") : cat(static_cast<int>(std::lround(v * 1000)) / 1000.0); };
    std::printf("%-28s %8.2f%% %9s %9s %9.1f%% %12s%s\n", s.name.c_str(), 100.0 * o.accuracy,
                score(o.norm_auc).c_str(), score(o.direction_auc).c_str(), 100.0 * o.ten_class,
                o.median_grad_norm > 0 ? cat(o.median_grad_norm).c_str() : "-",
                o.labels_read ? cat("   (", o.labels_read, " labels read from the Forwards)").c_str() : "");
    std::printf("{\"bench\":\"label_leakage\",\"setting\":\"%s\",\"cut\":\"%s\",\"sigma\":%g,\"test_accuracy\":%.5f,"
                "\"norm_auc\":%s,\"direction_auc\":%s,\"ten_class_attack_accuracy\":%.4f,\"labels_read\":%lld,"
                "\"median_grad_norm\":%.5g,\"steps_scored\":%lld,\"label_sigma\":%g}\n",
                s.name.c_str(), s.cut.c_str(), s.sigma < 0 ? 0.0 : s.sigma, o.accuracy,
                o.norm_auc < 0 ? "null" : cat(o.norm_auc).c_str(), o.direction_auc < 0 ? "null" : cat(o.direction_auc).c_str(),
                o.ten_class, static_cast<long long>(o.labels_read), o.median_grad_norm,
                static_cast<long long>(o.steps_scored), s.label_sigma < 0 ? 0.0 : s.label_sigma);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Program program("bench_label_leakage",
                          "What a curious cloud learns of the labels from the gradients a U-shaped edge sends up.");
  program.root()
      .option("model", "SPEC", "the model spec, JSON (required)")
      .option("epochs", "E", "epochs a setting (default 2)")
      .option("limit", "N", "training samples (default 0: all)")
      .option("test-limit", "N", "test samples (default 0: all)")
      .option("cut", "A", "the ordinary cut (default pool2)")
      .option("u-cut", "A,B", "the U-shaped cut (default pool2,relu3)")
      .option("grad-clip", "C", "the clip of --grad-noise's settings (default 1)")
      .option("sigmas", "S1,...", "--grad-noise sigmas to try (default 0.5,1)")
      .option("label-sigmas", "S1,...", "--label-noise sigmas to try (default 2,4)")
      .option("classes", "P,Q", "the two classes the AUC attacks tell apart (default 0,1)")
      .option("seed", "S", "the seed (default 1)")
      .optimizer_options(false)
      .details(tandem::kDetails)
      .run(tandem::main_impl);
  return program.main(argc, argv);
}
