#include "mineru_health/restart_policy.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace mineru_health {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Phase = WorkerPhase;
using A = AuditAction;

ProbeResult probe(ProbeStatus status, const std::string& detail = "") {
  ProbeResult r;
  r.worker_id = "w";
  r.status = status;
  r.detail = detail.empty() && status != ProbeStatus::kHealthy
                 ? to_string(status)
                 : detail;
  return r;
}

std::vector<A> actions(const Transition& t) {
  std::vector<A> out;
  for (const AuditEvent& e : t.events) out.push_back(e.action);
  return out;
}

// A policy on a fake clock: time moves only when the test says so.
class Harness {
 public:
  explicit Harness(PolicyOptions options) : policy_(options, start_) {}

  Transition ok() {
    return last_ = policy_.on_probe(probe(ProbeStatus::kHealthy), now_);
  }
  Transition fail(ProbeStatus s = ProbeStatus::kTimeout) {
    return last_ = policy_.on_probe(probe(s), now_);
  }
  Transition dead() { return fail(ProbeStatus::kEngineDead); }
  Transition exit_process() {
    return last_ = policy_.on_process_exit("exit code 1", now_);
  }
  Transition passive() {
    return last_ = policy_.on_passive_failure("EngineDeadError", now_);
  }
  Transition restart_failed() {
    return last_ = policy_.on_restart_failed("spawn failed", now_);
  }
  Transition tick() { return last_ = policy_.on_tick(now_); }
  void advance(Duration d) { now_ += d; }
  // Absolute fake time, in whole milliseconds since construction.
  void set_elapsed_ms(long long ms) { now_ = start_ + milliseconds(ms); }
  void advance_to_deadline() {
    ASSERT_TRUE(policy_.next_deadline().has_value());
    now_ = *policy_.next_deadline();
  }
  // Seconds since construction.
  double elapsed_s() const {
    return std::chrono::duration<double>(now_ - start_).count();
  }
  std::optional<double> deadline_s() const {
    auto d = policy_.next_deadline();
    if (!d) return std::nullopt;
    return std::chrono::duration<double>(*d - start_).count();
  }
  RestartPolicy& policy() { return policy_; }
  const Transition& last() const { return last_; }

 private:
  TimePoint start_ = TimePoint{} + std::chrono::hours(1);
  TimePoint now_ = start_;
  RestartPolicy policy_;
  Transition last_{Phase::kStarting, Phase::kStarting, {}, false};
};

// Every audit step starts where the previous one ended, and the chain spans
// the transition.
void expect_chained(const Transition& t) {
  WorkerPhase at = t.from;
  for (const AuditEvent& e : t.events) {
    EXPECT_EQ(e.from, at) << to_string(e.action);
    at = e.to;
  }
  if (!t.events.empty()) {
    EXPECT_EQ(at, t.to);
  }
}

TEST(BackoffTest, DoublesUpToTheCap) {
  PolicyOptions o;
  o.backoff_base = seconds(5);
  o.backoff_max = seconds(300);
  const int want[] = {5, 10, 20, 40, 80, 160, 300, 300, 300, 300};
  for (int attempt = 0; attempt < 10; ++attempt) {
    EXPECT_EQ(backoff_delay(o, attempt), seconds(want[attempt])) << attempt;
  }
}

TEST(BackoffTest, NeverOverflows) {
  PolicyOptions o;
  o.backoff_base = seconds(1);
  o.backoff_max = Duration::max();
  EXPECT_EQ(backoff_delay(o, 30), seconds(1LL << 30));
  EXPECT_EQ(backoff_delay(o, 62), Duration::max());  // 1e9 * 2^62 does not fit
  EXPECT_EQ(backoff_delay(o, 63), Duration::max());
  EXPECT_EQ(backoff_delay(o, 64), Duration::max());
  EXPECT_EQ(backoff_delay(o, 1000), Duration::max());
  EXPECT_EQ(backoff_delay(o, INT_MAX), Duration::max());
  o.backoff_base = Duration(1);
  EXPECT_EQ(backoff_delay(o, 62), Duration(1LL << 62));
  EXPECT_EQ(backoff_delay(o, -3), Duration(1));
  o.backoff_base = seconds(10);
  o.backoff_max = seconds(4);
  EXPECT_EQ(backoff_delay(o, 0), seconds(4));
}

// The reference loop: base 5 s, cap 300 s, 8 attempts, every restart fails
// to start. It gives up after 5+10+20+40+80+160+300+300 = 915 s.
TEST(RestartPolicyTest, ReferenceScheduleGivesUpAt915Seconds) {
  PolicyOptions o;
  o.backoff_base = seconds(5);
  o.backoff_max = seconds(300);
  o.max_attempts = 8;
  o.boot_timeout = seconds(60);
  Harness h(o);
  h.ok();
  ASSERT_EQ(h.policy().phase(), Phase::kHealthy);

  Transition t = h.exit_process();
  EXPECT_EQ(actions(t), (std::vector<A>{A::kEjected, A::kHealthFailed,
                                        A::kRestartScheduled}));
  expect_chained(t);
  EXPECT_FALSE(h.policy().in_rotation());

  std::vector<double> delays;
  double last = h.elapsed_s();
  for (int i = 0; i < 100 && h.policy().phase() != Phase::kGaveUp; ++i) {
    ASSERT_EQ(h.policy().phase(), Phase::kRestartScheduled);
    delays.push_back(*h.deadline_s() - last);
    h.advance_to_deadline();
    t = h.tick();
    ASSERT_TRUE(t.restart_now);
    ASSERT_EQ(h.policy().phase(), Phase::kRestarting);
    t = h.restart_failed();
    expect_chained(t);
    last = h.elapsed_s();
  }
  EXPECT_EQ(delays, (std::vector<double>{5, 10, 20, 40, 80, 160, 300, 300}));
  EXPECT_EQ(h.policy().phase(), Phase::kGaveUp);
  EXPECT_EQ(h.elapsed_s(), 915.0);
  EXPECT_EQ(actions(h.last()), (std::vector<A>{A::kRestartFailed, A::kGaveUp}));
  EXPECT_EQ(h.last().events.back().attempt, 8);
  EXPECT_EQ(h.policy().attempt(), 8);
  EXPECT_FALSE(h.policy().next_deadline().has_value());
}

// Envoy-style: drive the machine step by step and assert the exact phase,
// audit actions and next deadline after each step.
TEST(RestartPolicyTest, ExactDeadlineTable) {
  PolicyOptions o;
  o.failure_threshold = 2;
  o.backoff_base = seconds(1);
  o.backoff_max = seconds(4);
  o.max_attempts = 3;
  o.boot_timeout = seconds(10);
  Harness h(o);

  enum Op { kOk, kFail, kDead, kExit, kPassive, kTick, kRestartFailed };
  struct Step {
    double at_s;  // absolute fake time of the step
    Op op;
    Phase phase;
    std::vector<A> audit;
    std::optional<double> deadline_s;
    int attempt;
    bool restart_now;
  };
  const std::vector<Step> steps = {
      {0.0, kTick, Phase::kStarting, {}, 10.0, 0, false},
      {1.0, kOk, Phase::kHealthy, {}, std::nullopt, 0, false},
      {2.0, kFail, Phase::kUnhealthy, {A::kEjected}, std::nullopt, 0, false},
      {3.0, kOk, Phase::kHealthy, {A::kRecovered}, std::nullopt, 0, false},
      {4.0, kFail, Phase::kUnhealthy, {A::kEjected}, std::nullopt, 0, false},
      {6.0,
       kFail,
       Phase::kRestartScheduled,
       {A::kHealthFailed, A::kRestartScheduled},
       7.0,
       0,
       false},
      {6.5, kFail, Phase::kRestartScheduled, {}, 7.0, 0, false},  // no thrash
      {6.6, kOk, Phase::kRestartScheduled, {}, 7.0, 0, false},  // not cancelled
      {6.9, kTick, Phase::kRestartScheduled, {}, 7.0, 0, false},  // not due yet
      {7.0, kTick, Phase::kRestarting, {}, 17.0, 0, true},
      {8.0, kFail, Phase::kRestarting, {}, 17.0, 0, false},
      {9.0, kDead, Phase::kRestarting, {}, 17.0, 0, false},
      {17.0,
       kTick,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       19.0,
       1,
       false},
      {19.0, kTick, Phase::kRestarting, {}, 29.0, 1, true},
      {20.0,
       kOk,
       Phase::kHealthy,
       {A::kRestartSucceeded},
       std::nullopt,
       0,
       false},
      {21.0,
       kDead,
       Phase::kRestartScheduled,
       {A::kEjected, A::kHealthFailed, A::kRestartScheduled},
       22.0,
       0,
       false},
      {22.0, kTick, Phase::kRestarting, {}, 32.0, 0, true},
      {23.0,
       kExit,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       25.0,
       1,
       false},
      {25.0, kTick, Phase::kRestarting, {}, 35.0, 1, true},
      {25.0,
       kRestartFailed,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       29.0,
       2,
       false},
      {26.0, kPassive, Phase::kRestartScheduled, {}, 29.0, 2, false},
      {29.0, kTick, Phase::kRestarting, {}, 39.0, 2, true},
      {29.5,
       kRestartFailed,
       Phase::kGaveUp,
       {A::kRestartFailed, A::kGaveUp},
       std::nullopt,
       3,
       false},
      {30.0, kFail, Phase::kGaveUp, {}, std::nullopt, 3, false},
      {31.0, kExit, Phase::kGaveUp, {}, std::nullopt, 3, false},
      {32.0, kOk, Phase::kHealthy, {A::kRecovered}, std::nullopt, 0, false},
      {33.0,
       kPassive,
       Phase::kRestartScheduled,
       {A::kEjected, A::kHealthFailed, A::kRestartScheduled},
       34.0,
       0,
       false},
  };

  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    SCOPED_TRACE(::testing::Message()
                 << "step " << i << " at " << s.at_s << " s");
    h.set_elapsed_ms(std::llround(s.at_s * 1000));
    Transition t{Phase::kStarting, Phase::kStarting, {}, false};
    switch (s.op) {
      case kOk:
        t = h.ok();
        break;
      case kFail:
        t = h.fail();
        break;
      case kDead:
        t = h.dead();
        break;
      case kExit:
        t = h.exit_process();
        break;
      case kPassive:
        t = h.passive();
        break;
      case kTick:
        t = h.tick();
        break;
      case kRestartFailed:
        t = h.restart_failed();
        break;
    }
    EXPECT_EQ(to_string(h.policy().phase()), std::string(to_string(s.phase)));
    EXPECT_EQ(t.to, h.policy().phase());
    EXPECT_EQ(actions(t), s.audit);
    EXPECT_EQ(h.deadline_s(), s.deadline_s);
    EXPECT_EQ(h.policy().attempt(), s.attempt);
    EXPECT_EQ(t.restart_now, s.restart_now);
    EXPECT_EQ(h.policy().in_rotation(), s.phase == Phase::kHealthy);
    expect_chained(t);
  }
}

TEST(RestartPolicyTest, StartingToHealthyEmitsNothing) {
  Harness h(PolicyOptions{});
  Transition t = h.ok();
  EXPECT_EQ(t.from, Phase::kStarting);
  EXPECT_EQ(t.to, Phase::kHealthy);
  EXPECT_TRUE(t.changed());
  EXPECT_TRUE(t.events.empty());
  EXPECT_FALSE(h.policy().next_deadline().has_value());
}

TEST(RestartPolicyTest, HealthyThresholdDelaysReadmission) {
  PolicyOptions o;
  o.healthy_threshold = 2;
  o.restartable = false;
  Harness h(o);
  h.ok();
  EXPECT_EQ(h.policy().phase(), Phase::kStarting);
  h.ok();
  EXPECT_EQ(h.policy().phase(), Phase::kHealthy);
  h.fail();
  EXPECT_EQ(h.policy().phase(), Phase::kUnhealthy);
  EXPECT_TRUE(h.ok().events.empty());
  EXPECT_EQ(h.policy().phase(), Phase::kUnhealthy);
  EXPECT_EQ(h.policy().consecutive_successes(), 1);
  h.fail();  // resets the success streak
  h.ok();
  EXPECT_EQ(h.policy().phase(), Phase::kUnhealthy);
  EXPECT_EQ(actions(h.ok()), std::vector<A>{A::kRecovered});
  EXPECT_EQ(h.policy().phase(), Phase::kHealthy);
}

TEST(RestartPolicyTest, RemoteWorkerIsEjectedAndReadmittedNeverRestarted) {
  PolicyOptions o;
  o.restartable = false;
  o.failure_threshold = 3;
  Harness h(o);
  EXPECT_FALSE(
      h.policy().next_deadline().has_value());  // no boot deadline for remotes
  h.ok();
  EXPECT_EQ(actions(h.fail()), std::vector<A>{A::kEjected});
  EXPECT_TRUE(h.fail().events.empty());
  EXPECT_EQ(h.policy().consecutive_failures(), 2);
  Transition t = h.fail();
  EXPECT_EQ(actions(t), std::vector<A>{A::kHealthFailed});
  EXPECT_EQ(h.policy().phase(), Phase::kFailed);
  EXPECT_FALSE(h.policy().next_deadline().has_value());
  EXPECT_FALSE(h.tick().restart_now);
  EXPECT_EQ(actions(h.ok()), std::vector<A>{A::kRecovered});

  t = h.dead();
  EXPECT_EQ(actions(t), (std::vector<A>{A::kEjected, A::kHealthFailed}));
  EXPECT_EQ(h.policy().phase(), Phase::kFailed);
  EXPECT_EQ(h.policy().last_error(), "engine_dead");
}

TEST(RestartPolicyTest, RemoteWorkerThatNeverAnswersFailsAtThreshold) {
  PolicyOptions o;
  o.restartable = false;
  o.failure_threshold = 2;
  Harness h(o);
  EXPECT_TRUE(h.fail(ProbeStatus::kConnectError).events.empty());
  EXPECT_EQ(h.policy().phase(), Phase::kStarting);
  EXPECT_EQ(actions(h.fail(ProbeStatus::kConnectError)),
            std::vector<A>{A::kHealthFailed});
  EXPECT_EQ(h.policy().phase(), Phase::kFailed);
}

TEST(RestartPolicyTest, BootingLocalWorkerHasTheBootTimeout) {
  PolicyOptions o;
  o.failure_threshold = 2;
  o.boot_timeout = seconds(60);
  o.backoff_base = seconds(3);
  Harness h(o);
  for (int i = 0; i < 10; ++i) {
    h.advance(seconds(2));
    EXPECT_TRUE(h.fail(ProbeStatus::kConnectError).events.empty());
  }
  EXPECT_EQ(h.policy().phase(), Phase::kStarting);
  EXPECT_EQ(h.deadline_s(), 60.0);
  h.advance(seconds(40));
  Transition t = h.tick();
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kHealthFailed, A::kRestartScheduled}));
  EXPECT_EQ(h.deadline_s(), 63.0);
  EXPECT_NE(h.policy().last_error().find("boot timeout"), std::string::npos);
}

TEST(RestartPolicyTest, DeadEngineWhileStartingFailsAtOnce) {
  Harness h(PolicyOptions{});
  Transition t = h.dead();
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kHealthFailed, A::kRestartScheduled}));
  expect_chained(t);
}

TEST(RestartPolicyTest, ZeroAttemptsGivesUpInsteadOfRestarting) {
  PolicyOptions o;
  o.max_attempts = 0;
  Harness h(o);
  h.ok();
  Transition t = h.passive();
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kEjected, A::kHealthFailed, A::kGaveUp}));
  EXPECT_EQ(h.policy().phase(), Phase::kGaveUp);
  EXPECT_FALSE(h.policy().next_deadline().has_value());
}

TEST(RestartPolicyTest, ThresholdOneEjectsAndFailsInOneStep) {
  PolicyOptions o;
  o.failure_threshold = 1;
  Harness h(o);
  h.ok();
  Transition t = h.fail(ProbeStatus::kHttpStatus);
  EXPECT_EQ(actions(t), (std::vector<A>{A::kEjected, A::kHealthFailed,
                                        A::kRestartScheduled}));
  expect_chained(t);
  EXPECT_EQ(t.events[0].reason, "http_status");
}

TEST(RestartPolicyTest, RestartFailedOutsideRestartingIsIgnored) {
  Harness h(PolicyOptions{});
  h.ok();
  Transition t = h.restart_failed();
  EXPECT_FALSE(t.changed());
  EXPECT_TRUE(t.events.empty());
  EXPECT_EQ(h.policy().attempt(), 0);
}

TEST(RestartPolicyTest, BootTimeoutCountsAFailedAttempt) {
  PolicyOptions o;
  o.backoff_base = seconds(2);
  o.backoff_max = seconds(100);
  o.boot_timeout = seconds(30);
  Harness h(o);
  h.ok();
  h.exit_process();
  h.advance_to_deadline();
  ASSERT_TRUE(h.tick().restart_now);
  h.advance(seconds(29));
  EXPECT_TRUE(h.tick().events.empty());
  h.advance(seconds(1));
  Transition t = h.tick();
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kRestartFailed, A::kRestartScheduled}));
  EXPECT_EQ(t.events[0].attempt, 0);
  EXPECT_EQ(t.events[1].attempt, 1);
  EXPECT_EQ(h.policy().attempt(), 1);
  EXPECT_EQ(h.deadline_s(), 2.0 + 30.0 + 4.0);
  EXPECT_NE(h.policy().last_error().find("boot timeout"), std::string::npos);
}

TEST(RestartPolicyTest, NamesAreStable) {
  EXPECT_STREQ(to_string(Phase::kRestartScheduled), "restart_scheduled");
  EXPECT_STREQ(to_string(Phase::kGaveUp), "gave_up");
  EXPECT_STREQ(to_string(A::kHealthFailed), "health_failed");
  EXPECT_STREQ(to_string(A::kRestartSucceeded), "auto_restart_success");
  EXPECT_STREQ(to_string(A::kGaveUp), "auto_restart_gave_up");
  for (int p = 0; p <= static_cast<int>(Phase::kGaveUp); ++p) {
    EXPECT_STRNE(to_string(static_cast<Phase>(p)), "unknown");
  }
  for (int a = 0; a <= static_cast<int>(A::kEjected); ++a) {
    EXPECT_STRNE(to_string(static_cast<A>(a)), "unknown");
  }
}

}  // namespace
}  // namespace mineru_health
