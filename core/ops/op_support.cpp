#include "core/ops/op_support.h"

#include <algorithm>

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

Shape broadcast(const NodeSpec& n, const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  int64_t dims[kMaxRank] = {};
  for (int i = 0; i < rank; ++i) {  // from the last axis
    const int ia = a.rank() - 1 - i, ib = b.rank() - 1 - i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail_node(n, cat("inputs of shapes ", a.str(), " and ", b.str(), " do not broadcast (their axis ", -1 - i, " is ", da,
                       " and ", db, "; each must be equal or 1)"));
    dims[rank - 1 - i] = std::max(da, db);
  }
  return Shape::of(dims, rank);
}

}  // namespace tandem::ops
