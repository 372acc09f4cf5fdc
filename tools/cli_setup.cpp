#include "tools/cli_setup.h"

#include "core/error.h"
#include "backends/registry.h"

namespace tandem {

SplitModel load_split_model(const CliArgs& args) {
  SplitModel m{load_model_spec(args.required("model")), {}, {}, {}, {}, false, {}};
  m.graph = Graph::build(m.spec);
  m.cut = m.graph.cut_nodes(args.str("cut", m.graph.default_cut()));
  if (m.cut.empty()) fail("cli", "the spec names no default cut; pass --cut NODE");
  std::tie(m.front, m.back) = m.graph.split(m.cut);
  m.u_shaped = u_shaped_cut(m.cut);
  if (m.u_shaped) m.tail = m.graph.tail(m.cut);
  return m;
}

ShardBackends shard_backends(const CliArgs& args) {
  BackendOptions options;
  options.threads = static_cast<int>(args.integer("threads", 1, 1));
  ShardBackends b;
  b.edge_name = args.str("edge-backend", preferred_backend("xnnpack"));
  b.cloud_name = args.str("cloud-backend", preferred_backend("onednn"));
  b.edge = make_backend(b.edge_name, options);
  b.cloud = make_backend(b.cloud_name, options);
  return b;
}

}  // namespace tandem
