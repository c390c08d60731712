// What the router counts of each worker, counted where it happens. The poller
// makes every probe and every restart-policy call, so it counts them here,
// under its own lock; the metrics read a copy at scrape time
// (WorkerStatus::counters) instead of counting the events they are handed,
// which can be dropped (a full event queue) and could drift from the state.
//
// A plain value: not thread-safe; the poller owns one per worker, under its
// mutex, and hands out copies.
#ifndef MINERU_HEALTH_WORKER_COUNTERS_H_
#define MINERU_HEALTH_WORKER_COUNTERS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mineru_health/probe.h"
#include "mineru_health/restart_policy.h"

namespace mineru_health {

struct WorkerCounters {
  // Upper bounds (seconds) of the probe-duration histogram: healthy probes
  // answer in milliseconds, failing ones run up to the probe timeout (1.5 s
  // by default, 10 s in the slowest preset).
  static const std::vector<double>& latency_bounds();

  // Finished probes, by ProbeStatus (its to_string spelling).
  std::map<std::string, std::uint64_t> probes;
  // Restart-policy audit events, by AuditAction (its to_string spelling).
  std::map<std::string, std::uint64_t> audits;
  // Times taken out of rotation (kEjected), by cause (restart_policy.h).
  std::map<std::string, std::uint64_t> ejections;
  // Probe durations: one count per bound of latency_bounds(), then one for
  // longer ones (not cumulative), and their sum.
  std::vector<std::uint64_t> latency_counts =
      std::vector<std::uint64_t>(latency_bounds().size() + 1, 0);
  double latency_sum_s = 0;
  // Unix time the last probe finished; unset before the first.
  std::optional<double> last_probe_unix_time;

  void count_probe(const ProbeResult& result, double unix_time);
  void count_audit(const AuditEvent& event);
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_WORKER_COUNTERS_H_
