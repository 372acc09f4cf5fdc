#include "core/planner.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

double simulate_step(const std::vector<MicrobatchCost>& mbs) {
  double edge = 0, up = 0, cloud = 0, down = 0;
  std::vector<double> arrived(mbs.size());
  for (std::size_t i = 0; i < mbs.size(); ++i) {
    edge += mbs[i].edge_forward_s;
    up = std::max(up, edge) + mbs[i].up_s;
    cloud = std::max(cloud, up) + mbs[i].cloud_s;
    down = std::max(down, cloud) + mbs[i].down_s;
    arrived[i] = down;
  }
  // Gradients arrive in order; each backward starts when it is in and the edge is free.
  for (std::size_t i = 0; i < mbs.size(); ++i) edge = std::max(edge, arrived[i]) + mbs[i].edge_backward_s;
  return edge;
}

const PlanRow& recommend(const std::vector<PlanRow>& rows) {
  const PlanRow* best = nullptr;
  for (const PlanRow& r : rows)
    if (r.fits && (!best || r.samples_per_s > best->samples_per_s)) best = &r;
  if (!best) fail("planner", "no cut fits in the edge's memory; raise --edge-memory-mb or use a smaller batch");
  return *best;
}

}  // namespace tandem
