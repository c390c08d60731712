#include "mineru_health/worker_counters.h"

#include <algorithm>
#include <cmath>

namespace mineru_health {

const std::vector<double>& WorkerCounters::latency_bounds() {
  static const std::vector<double> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                             0.05,  0.1,    0.25,  0.5,  1.0,
                                             2.5,   5.0,    10.0};
  return bounds;
}

void WorkerCounters::count_probe(const ProbeResult& result, double unix_time) {
  ++probes[to_string(result.status)];
  // A clock step or a bad value must not poison the sum or the buckets.
  const double latency =
      std::isfinite(result.latency_s) ? std::max(0.0, result.latency_s) : 0.0;
  const std::vector<double>& bounds = latency_bounds();
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), latency);
  ++latency_counts[static_cast<std::size_t>(bucket - bounds.begin())];
  latency_sum_s += latency;
  last_probe_unix_time = unix_time;
}

void WorkerCounters::count_audit(const AuditEvent& event) {
  ++audits[to_string(event.action)];
  if (event.action == AuditAction::kEjected) ++ejections[event.cause];
}

}  // namespace mineru_health
