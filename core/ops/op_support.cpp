#include "core/ops/op_support.h"

namespace tandem::ops {

void expect_inputs(const NodeSpec& n, std::span<const Shape> in, std::size_t count, int rank) {
  if (in.size() != count)
    fail("graph", cat("node '", n.name, "' (", n.op, "): field 'inputs' needs ", count, count == 1 ? " input" : " inputs",
                      ", got ", in.size()));
  if (rank > 0 && in[0].rank() != rank)
    fail("graph", cat("node '", n.name, "' (", n.op, "): expects a rank-", rank, " input per sample, got ", in[0].str(),
                      rank == 1 ? " (add a flatten node before it)" : ""));
}

Pair read_pair(const flatbuffers::Vector<int32_t>* v, Pair fallback, const std::string& label, std::string_view field,
               int64_t min_value) {
  if (!v || v->size() == 0) return fallback;
  if (v->size() > 2) fail("model spec", cat(label, ": field '", field, "' takes 1 or 2 values, got ", v->size()));
  Pair p{v->Get(0), v->Get(v->size() - 1)};
  for (int64_t x : p)
    if (x < min_value) fail("model spec", cat(label, ": field '", field, "' must be >= ", min_value, ", got ", x));
  return p;
}

void fail_node(const NodeSpec& n, const std::string& text) {
  fail("graph", cat("node '", n.name, "' (", n.op, "): ", text));
}

void fail_attr(const std::string& label, std::string_view op, const std::string& text) {
  fail("model spec", cat(label, " (", op, "): ", text));
}

}  // namespace tandem::ops
