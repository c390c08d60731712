#include "mineru_health/worker_counters.h"

#include <gtest/gtest.h>

#include <limits>

namespace mineru_health {
namespace {

ProbeResult probe(ProbeStatus status, double latency_s) {
  ProbeResult r;
  r.status = status;
  r.latency_s = latency_s;
  return r;
}

TEST(WorkerCountersTest, ProbesAreCountedByStatusAndDuration) {
  WorkerCounters c;
  c.count_probe(probe(ProbeStatus::kHealthy, 0.001),
                100.0);  // on a bound: in it
  c.count_probe(probe(ProbeStatus::kHealthy, 0.003), 101.0);
  c.count_probe(probe(ProbeStatus::kTimeout, 20.0), 102.0);  // past the last
  EXPECT_EQ(c.probes.at("healthy"), 2u);
  EXPECT_EQ(c.probes.at("timeout"), 1u);
  const std::size_t last = WorkerCounters::latency_bounds().size();
  ASSERT_EQ(c.latency_counts.size(), last + 1);
  EXPECT_EQ(c.latency_counts[0], 1u);  // <= 0.001
  EXPECT_EQ(c.latency_counts[2], 1u);  // <= 0.005
  EXPECT_EQ(c.latency_counts[last], 1u);
  EXPECT_DOUBLE_EQ(c.latency_sum_s, 20.004);
  EXPECT_EQ(c.last_probe_unix_time, 102.0);
}

TEST(WorkerCountersTest, OddDurationsCountAsZero) {
  WorkerCounters c;
  c.count_probe(probe(ProbeStatus::kHealthy, -1.0), 1.0);
  c.count_probe(
      probe(ProbeStatus::kHealthy, std::numeric_limits<double>::quiet_NaN()),
      2.0);
  EXPECT_EQ(c.latency_counts[0], 2u);
  EXPECT_EQ(c.latency_sum_s, 0.0);
}

TEST(WorkerCountersTest, EjectionsAreCountedByCause) {
  WorkerCounters c;
  c.count_audit({AuditAction::kEjected, 0, "r", WorkerPhase::kHealthy,
                 WorkerPhase::kUnhealthy, "timeout"});
  c.count_audit({AuditAction::kEjected, 0, "r", WorkerPhase::kHealthy,
                 WorkerPhase::kFailed, kCauseProcessExit});
  c.count_audit({AuditAction::kAdmitted, 0, "r", WorkerPhase::kStarting,
                 WorkerPhase::kHealthy, ""});
  EXPECT_EQ(c.audits.at("ejected"), 2u);
  EXPECT_EQ(c.audits.at("admitted"), 1u);
  EXPECT_EQ(c.ejections.at("timeout"), 1u);
  EXPECT_EQ(c.ejections.at(kCauseProcessExit), 1u);
  EXPECT_EQ(c.ejections.size(), 2u);
}

}  // namespace
}  // namespace mineru_health
