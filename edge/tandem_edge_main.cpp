// tandem-edge: the edge agent's command line (`train`).
#include <cstdio>
#include <string>

#include "core/error.h"
#include "edge/agent/edge_agent.h"
#include "tools/all_backends.h"
#include "tools/cli_args.h"

namespace tandem {
namespace {

constexpr const char* kUsage = R"(usage:
  tandem-edge train --cloud wss://HOST:PORT --identity IDDIR --model SPEC [--cut NODE]
                    [--data fashion-mnist] [--epochs N] [--limit SAMPLES] [--test-limit SAMPLES]
                    [--batch B] [--microbatches K] [--lr X] [--momentum X] [--weight-decay X]
                    [--seed S] [--backend NAME] [--metrics-json FILE]
      Trains the front shard on local Fashion-MNIST against the cloud (mutual TLS with
      IDDIR/client.crt, client.key, ca.crt from `tandem-cloud pki issue`); raw data never
      leaves this machine, only cut-layer activations. Evaluates through the cloud after
      each epoch; prints progress and metrics (also JSON lines in FILE).
)";

int train_command(int argc, char** argv) {
  const CliArgs args(argc, argv, 2, {});
  args.reject_unknown({"cloud", "identity", "model", "cut", "data", "epochs", "limit", "test-limit", "batch",
                       "microbatches", "lr", "momentum", "weight-decay", "seed", "backend", "metrics-json"});
  EdgeTrainOptions o;
  const std::string url = args.required("cloud");
  const std::string prefix = "wss://";
  if (url.rfind(prefix, 0) != 0)
    fail("cli", cat("--cloud must be a wss:// address (TLS is always on), got '", url, "'"));
  std::string hostport = url.substr(prefix.size());
  if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos) fail("cli", cat("--cloud expects wss://HOST:PORT, got '", url, "'"));
  o.host = hostport.substr(0, colon);
  try {
    o.port = std::stoi(hostport.substr(colon + 1));
  } catch (const std::exception&) {
    fail("cli", cat("--cloud expects wss://HOST:PORT, got '", url, "'"));
  }
  o.identity_dir = args.required("identity");
  o.model_path = args.required("model");
  o.cut = args.str("cut", "");
  if (args.str("data", "fashion-mnist") != "fashion-mnist")
    fail("cli", cat("--data knows only fashion-mnist, got '", args.str("data", ""), "'"));
  o.epochs = args.integer("epochs", 1, 1);
  o.limit = args.integer("limit", 0, 0);
  o.test_limit = args.integer("test-limit", 0, 0);
  o.batch = static_cast<uint32_t>(args.integer("batch", 64, 1));
  o.microbatches = static_cast<uint32_t>(args.integer("microbatches", 4, 1));
  o.sgd.lr = static_cast<float>(args.number("lr", 0.05));
  o.sgd.momentum = static_cast<float>(args.number("momentum", 0.9));
  o.sgd.weight_decay = static_cast<float>(args.number("weight-decay", 0.0));
  o.seed = static_cast<uint64_t>(args.integer("seed", 1, 0));
  register_built_backends();
  o.backend = args.str("backend", "xnnpack");
  o.metrics_json = args.str("metrics-json", "");
  return train_over_wss(o);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "train") return tandem::train_command(argc, argv);
    if (command == "--help" || command == "-h" || command == "help") {
      std::fputs(tandem::kUsage, stdout);
      return 0;
    }
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem-edge: %s\n", e.what());
    return 1;
  }
  std::fputs(tandem::kUsage, stderr);
  return 2;
}
