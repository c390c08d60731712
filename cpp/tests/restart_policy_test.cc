#include "mineru_health/restart_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
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
  Transition fail(ProbeStatus s = ProbeStatus::kTimeout,
                  const EjectionGate& gate = {}) {
    return last_ = policy_.on_probe(probe(s), now_, gate);
  }
  Transition dead() { return fail(ProbeStatus::kEngineDead); }
  Transition hung() { return fail(ProbeStatus::kLoopHung); }
  Transition started() { return last_ = policy_.on_process_started(now_); }
  Transition exit_process(std::optional<int> code = 1) {
    return last_ = policy_.on_process_exit("exit code 1", code, now_);
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
    EXPECT_EQ(actions(t), std::vector<A>{A::kRestartRequested});
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
  o.stable_window = seconds(30);
  Harness h(o);

  enum Op { kOk, kFail, kDead, kExit, kPassive, kTick, kRestartFailed, kStart };
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
      {1.0, kOk, Phase::kHealthy, {A::kAdmitted}, std::nullopt, 0, false},
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
      // Boot deadline from the request until the owner reports the process.
      {7.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 17.0, 0, true},
      // The old process's answers are not held against the attempt.
      {8.0, kFail, Phase::kRestarting, {}, 17.0, 0, false},
      {9.0, kDead, Phase::kRestarting, {}, 17.0, 0, false},
      {9.5, kExit, Phase::kRestarting, {}, 17.0, 0, false},
      // The new process started: the boot deadline runs from here.
      {12.0, kStart, Phase::kRestarting, {}, 22.0, 0, false},
      // A definitive answer from it fails the attempt at once.
      {13.0,
       kDead,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       15.0,
       1,
       false},
      {15.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 25.0, 1, true},
      {16.0, kStart, Phase::kRestarting, {}, 26.0, 1, false},
      // Healthy again, but the restart counts only after the window.
      {17.0, kOk, Phase::kHealthy, {A::kAdmitted}, 47.0, 1, false},
      {20.0,
       kDead,
       Phase::kRestartScheduled,
       {A::kEjected, A::kHealthFailed, A::kRestartFailed, A::kRestartScheduled},
       24.0,
       2,
       false},
      {24.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 34.0, 2, true},
      {25.0, kStart, Phase::kRestarting, {}, 35.0, 2, false},
      {26.0, kOk, Phase::kHealthy, {A::kAdmitted}, 56.0, 2, false},
      {55.9, kTick, Phase::kHealthy, {}, 56.0, 2, false},
      {56.0,
       kTick,
       Phase::kHealthy,
       {A::kRestartSucceeded},
       std::nullopt,
       0,
       false},
      {57.0,
       kExit,
       Phase::kRestartScheduled,
       {A::kEjected, A::kHealthFailed, A::kRestartScheduled},
       58.0,
       0,
       false},
      {58.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 68.0, 0, true},
      {58.0,
       kRestartFailed,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       60.0,
       1,
       false},
      {59.0, kPassive, Phase::kRestartScheduled, {}, 60.0, 1, false},
      {60.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 70.0, 1, true},
      {61.0, kStart, Phase::kRestarting, {}, 71.0, 1, false},
      {62.0,
       kExit,
       Phase::kRestartScheduled,
       {A::kRestartFailed, A::kRestartScheduled},
       66.0,
       2,
       false},
      {66.0, kTick, Phase::kRestarting, {A::kRestartRequested}, 76.0, 2, true},
      // Never reported started: fails one boot timeout after the request.
      {76.0,
       kTick,
       Phase::kGaveUp,
       {A::kRestartFailed, A::kGaveUp},
       std::nullopt,
       3,
       false},
      {77.0, kFail, Phase::kGaveUp, {}, std::nullopt, 3, false},
      {78.0, kExit, Phase::kGaveUp, {}, std::nullopt, 3, false},
      // Back by itself; attempts kept for one window.
      {79.0, kOk, Phase::kHealthy, {A::kRecovered}, 109.0, 3, false},
      {80.0,
       kPassive,
       Phase::kGaveUp,
       {A::kEjected, A::kHealthFailed, A::kGaveUp},
       std::nullopt,
       3,
       false},
      {81.0, kOk, Phase::kHealthy, {A::kRecovered}, 111.0, 3, false},
      {111.0, kTick, Phase::kHealthy, {}, std::nullopt, 0, false},
      {112.0,
       kPassive,
       Phase::kRestartScheduled,
       {A::kEjected, A::kHealthFailed, A::kRestartScheduled},
       113.0,
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
      case kStart:
        t = h.started();
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

TEST(RestartPolicyTest, StartingToHealthyIsAdmitted) {
  Harness h(PolicyOptions{});
  Transition t = h.ok();
  EXPECT_EQ(t.from, Phase::kStarting);
  EXPECT_EQ(t.to, Phase::kHealthy);
  EXPECT_TRUE(t.changed());
  EXPECT_EQ(actions(t), std::vector<A>{A::kAdmitted});
  expect_chained(t);
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
  EXPECT_STREQ(to_string(A::kAdmitted), "admitted");
  EXPECT_STREQ(to_string(A::kEjectionSuppressed), "ejection_suppressed");
  EXPECT_STREQ(to_string(A::kRestartRequested), "auto_restart_requested");
  for (int p = 0; p <= static_cast<int>(Phase::kGaveUp); ++p) {
    EXPECT_STRNE(to_string(static_cast<Phase>(p)), "unknown");
  }
  for (int a = 0; a <= static_cast<int>(A::kRestartRequested); ++a) {
    EXPECT_STRNE(to_string(static_cast<A>(a)), "unknown");
  }
}

TEST(RestartPolicyTest, FailureCauseNamesCoverEveryCause) {
  const std::vector<std::string> names = failure_cause_names();
  for (const char* want :
       {"timeout", "connect_error", "engine_dead", "loop_hung", "http_status",
        "transport_error", "process_exit", "passive_failure", "boot_timeout",
        "restart_failed"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "healthy"), names.end());
}

// Drives a local worker from healthy to its first restart request.
void fail_and_request_restart(Harness& h) {
  h.ok();
  h.exit_process();
  h.advance_to_deadline();
  ASSERT_TRUE(h.tick().restart_now);
}

// Issue 10: a worker that dies again a few seconds after every restart used
// to reset its attempt count on each "success" and churn forever.
TEST(RestartPolicyTest, WorkerDyingRightAfterEachRestartGivesUp) {
  PolicyOptions o;
  o.max_attempts = 3;
  o.backoff_base = seconds(1);
  o.backoff_max = seconds(8);
  o.stable_window = seconds(600);
  Harness h(o);
  h.ok();
  h.dead();
  std::vector<int> attempts_seen;
  for (int i = 0; i < 20 && h.policy().phase() != Phase::kGaveUp; ++i) {
    ASSERT_EQ(h.policy().phase(), Phase::kRestartScheduled);
    h.advance_to_deadline();
    ASSERT_TRUE(h.tick().restart_now);
    h.advance(seconds(20));
    h.started();
    h.advance(seconds(40));
    EXPECT_EQ(actions(h.ok()), std::vector<A>{A::kAdmitted});
    attempts_seen.push_back(h.policy().attempt());
    h.advance(seconds(5));
    Transition t = h.dead();
    expect_chained(t);
    ASSERT_GE(t.events.size(), 3u);
    EXPECT_EQ(t.events[2].action, A::kRestartFailed);
    EXPECT_EQ(t.events[2].cause, "engine_dead");
  }
  EXPECT_EQ(h.policy().phase(), Phase::kGaveUp);
  EXPECT_EQ(attempts_seen, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(h.policy().attempt(), 3);
}

TEST(RestartPolicyTest, StableWindowZeroConfirmsAtTheFirstHealthyAnswer) {
  PolicyOptions o;
  o.stable_window = Duration::zero();
  Harness h(o);
  fail_and_request_restart(h);
  h.restart_failed();
  h.advance_to_deadline();
  ASSERT_TRUE(h.tick().restart_now);
  h.started();
  EXPECT_EQ(h.policy().attempt(), 1);
  Transition t = h.ok();
  EXPECT_EQ(actions(t), (std::vector<A>{A::kAdmitted, A::kRestartSucceeded}));
  EXPECT_EQ(t.events[1].attempt, 1);
  EXPECT_EQ(h.policy().attempt(), 0);
  EXPECT_FALSE(h.policy().next_deadline().has_value());
}

TEST(RestartPolicyTest, EjectionDuringTheWindowRestartsIt) {
  PolicyOptions o;
  o.stable_window = seconds(100);
  o.failure_threshold = 3;
  Harness h(o);
  fail_and_request_restart(h);
  h.started();
  h.ok();
  EXPECT_EQ(h.deadline_s(), h.elapsed_s() + 100);
  h.advance(seconds(90));
  EXPECT_EQ(actions(h.fail()), std::vector<A>{A::kEjected});
  EXPECT_FALSE(h.policy().next_deadline().has_value());
  h.advance(seconds(5));
  EXPECT_EQ(actions(h.ok()), std::vector<A>{A::kRecovered});
  EXPECT_EQ(h.deadline_s(), h.elapsed_s() + 100);  // a whole window again
  h.advance(seconds(99));
  EXPECT_TRUE(h.tick().events.empty());
  h.advance(seconds(1));
  EXPECT_EQ(actions(h.tick()), std::vector<A>{A::kRestartSucceeded});
  EXPECT_EQ(h.policy().attempt(), 0);
}

// Issue 10: with a 300 s boot timeout, a replacement answering engine_dead
// took each attempt the whole timeout (about 25 min to gave_up).
TEST(RestartPolicyTest, DefinitiveAnswersWhileRestartingGiveUpWithinBackoff) {
  for (ProbeStatus definitive :
       {ProbeStatus::kEngineDead, ProbeStatus::kLoopHung}) {
    SCOPED_TRACE(to_string(definitive));
    PolicyOptions o;  // production: 1 s..60 s backoff, 5 attempts, 300 s boot
    Harness h(o);
    h.ok();
    h.fail(definitive);
    for (int i = 0; i < 20 && h.policy().phase() != Phase::kGaveUp; ++i) {
      h.advance_to_deadline();
      ASSERT_TRUE(h.tick().restart_now);
      h.advance(seconds(2));
      h.started();
      h.advance(seconds(1));
      Transition t = h.fail(definitive);
      ASSERT_FALSE(t.events.empty());
      EXPECT_EQ(t.events[0].action, A::kRestartFailed);
      EXPECT_EQ(t.events[0].cause, to_string(definitive));
    }
    EXPECT_EQ(h.policy().phase(), Phase::kGaveUp);
    // Backoff 1+2+4+8+16 s plus 3 s per attempt.
    EXPECT_EQ(h.elapsed_s(), 31.0 + 5 * 3.0);
  }
}

TEST(RestartPolicyTest, BootDeadlineRunsFromProcessStart) {
  PolicyOptions o;
  o.boot_timeout = seconds(300);
  Harness h(o);
  fail_and_request_restart(h);
  const double requested = h.elapsed_s();
  EXPECT_EQ(h.deadline_s(), requested + 300);
  EXPECT_TRUE(h.policy().awaiting_process());
  h.advance(seconds(250));  // a slow launch
  h.started();
  EXPECT_FALSE(h.policy().awaiting_process());
  EXPECT_EQ(h.deadline_s(), requested + 550);
  h.advance(seconds(100));
  EXPECT_TRUE(h.tick().events.empty());
  EXPECT_EQ(h.policy().phase(), Phase::kRestarting);
  h.advance(seconds(200));
  Transition t = h.tick();
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kRestartFailed, A::kRestartScheduled}));
  EXPECT_EQ(t.events[0].cause, kCauseBootTimeout);
  EXPECT_EQ(h.policy().last_cause(), kCauseBootTimeout);
}

TEST(RestartPolicyTest, FirstBootDeadlineRunsFromProcessStartToo) {
  PolicyOptions o;
  o.boot_timeout = seconds(60);
  Harness h(o);
  h.advance(seconds(50));
  h.started();
  EXPECT_EQ(h.deadline_s(), 110.0);
  h.advance(seconds(59));
  EXPECT_TRUE(h.tick().events.empty());
  h.advance(seconds(1));
  EXPECT_EQ(actions(h.tick()),
            (std::vector<A>{A::kHealthFailed, A::kRestartScheduled}));
  EXPECT_EQ(h.policy().last_cause(), kCauseBootTimeout);
}

TEST(RestartPolicyTest, RemoteWorkersIgnoreProcessStart) {
  PolicyOptions o;
  o.restartable = false;
  Harness h(o);
  EXPECT_FALSE(h.started().changed());
  EXPECT_FALSE(h.policy().next_deadline().has_value());
}

TEST(RestartPolicyTest, ExitCodeAndCauseAreRecorded) {
  Harness h(PolicyOptions{});
  h.ok();
  EXPECT_FALSE(h.policy().last_exit_code().has_value());
  Transition t = h.exit_process(-9);
  EXPECT_EQ(h.policy().last_exit_code(), -9);
  EXPECT_EQ(h.policy().last_cause(), kCauseProcessExit);
  for (const AuditEvent& e : t.events) EXPECT_EQ(e.cause, kCauseProcessExit);
  // A restart whose new process exits: the attempt fails with that code.
  h.advance_to_deadline();
  h.tick();
  h.started();
  t = h.exit_process(75);
  EXPECT_EQ(actions(t),
            (std::vector<A>{A::kRestartFailed, A::kRestartScheduled}));
  EXPECT_EQ(h.policy().last_exit_code(), 75);
  // The cause survives a recovery: it is the last failure's.
  h.advance_to_deadline();
  h.tick();
  h.started();
  h.ok();
  EXPECT_EQ(h.policy().last_cause(), kCauseProcessExit);
  EXPECT_EQ(h.policy().last_error(), "");
}

struct CauseCase {
  const char* name;
  std::function<void(Harness&)> fail;
  const char* cause;
};

class CauseTest : public ::testing::TestWithParam<CauseCase> {};

TEST_P(CauseTest, LastCauseNamesTheFailure) {
  PolicyOptions o;
  o.failure_threshold = 1;
  Harness h(o);
  h.ok();
  GetParam().fail(h);
  EXPECT_EQ(h.policy().last_cause(), GetParam().cause);
  EXPECT_NE(h.policy().phase(), Phase::kHealthy);
}

INSTANTIATE_TEST_SUITE_P(
    Causes, CauseTest,
    ::testing::Values(
        CauseCase{"timeout", [](Harness& h) { h.fail(); }, "timeout"},
        CauseCase{"engine_dead", [](Harness& h) { h.dead(); }, "engine_dead"},
        CauseCase{"loop_hung", [](Harness& h) { h.hung(); }, "loop_hung"},
        CauseCase{"http", [](Harness& h) { h.fail(ProbeStatus::kHttpStatus); },
                  "http_status"},
        CauseCase{"exit", [](Harness& h) { h.exit_process(); }, "process_exit"},
        CauseCase{"passive", [](Harness& h) { h.passive(); },
                  "passive_failure"},
        CauseCase{"spawn",
                  [](Harness& h) {
                    h.exit_process();
                    h.advance_to_deadline();
                    h.tick();
                    h.restart_failed();
                  },
                  "restart_failed"},
        CauseCase{"boot",
                  [](Harness& h) {
                    h.exit_process();
                    h.advance_to_deadline();
                    h.tick();
                    h.started();
                    h.advance_to_deadline();
                    h.tick();
                  },
                  "boot_timeout"}),
    [](const ::testing::TestParamInfo<CauseCase>& param_info) {
      return std::string(param_info.param.name);
    });

// The mass-ejection guard, exhaustively: every failure input, gate open or
// closed, from a healthy worker at and below the failure threshold.
struct GateCase {
  const char* name;
  enum Input { kTimeout, kHttp, kEngineDead, kLoopHung, kExit, kPassive } input;
  bool allowed;
  int threshold;
  Phase phase;
  std::vector<A> audit;
};

class EjectionGateTest : public ::testing::TestWithParam<GateCase> {};

TEST_P(EjectionGateTest, OnlyNonDefinitiveEjectionsAreHeldBack) {
  const GateCase& c = GetParam();
  PolicyOptions o;
  o.failure_threshold = c.threshold;
  Harness h(o);
  h.ok();
  const EjectionGate gate{c.allowed, "1 of 2 workers already out"};
  Transition t;
  switch (c.input) {
    case GateCase::kTimeout:
      t = h.fail(ProbeStatus::kTimeout, gate);
      break;
    case GateCase::kHttp:
      t = h.fail(ProbeStatus::kHttpStatus, gate);
      break;
    case GateCase::kEngineDead:
      t = h.fail(ProbeStatus::kEngineDead, gate);
      break;
    case GateCase::kLoopHung:
      t = h.fail(ProbeStatus::kLoopHung, gate);
      break;
    case GateCase::kExit:
      t = h.exit_process();
      break;
    case GateCase::kPassive:
      t = h.passive();
      break;
  }
  EXPECT_EQ(to_string(h.policy().phase()), std::string(to_string(c.phase)));
  EXPECT_EQ(actions(t), c.audit);
  expect_chained(t);
  EXPECT_EQ(h.policy().ejection_suppressed(),
            !c.audit.empty() && c.audit[0] == A::kEjectionSuppressed);
  if (h.policy().ejection_suppressed()) {
    EXPECT_TRUE(h.policy().in_rotation());
    EXPECT_NE(t.events[0].reason.find("1 of 2 workers already out"),
              std::string::npos);
    EXPECT_FALSE(t.events[0].cause.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gate, EjectionGateTest,
    ::testing::Values(
        GateCase{"timeout_allowed",
                 GateCase::kTimeout,
                 true,
                 3,
                 Phase::kUnhealthy,
                 {A::kEjected}},
        GateCase{"timeout_held",
                 GateCase::kTimeout,
                 false,
                 3,
                 Phase::kHealthy,
                 {A::kEjectionSuppressed}},
        GateCase{"timeout_threshold_one_allowed",
                 GateCase::kTimeout,
                 true,
                 1,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}},
        GateCase{"timeout_threshold_one_held",
                 GateCase::kTimeout,
                 false,
                 1,
                 Phase::kHealthy,
                 {A::kEjectionSuppressed}},
        GateCase{"http_held",
                 GateCase::kHttp,
                 false,
                 3,
                 Phase::kHealthy,
                 {A::kEjectionSuppressed}},
        GateCase{"passive_allowed",
                 GateCase::kPassive,
                 true,
                 3,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}},
        GateCase{"passive_ignores_gate",
                 GateCase::kPassive,
                 false,
                 3,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}},
        GateCase{"engine_dead_ignores_gate",
                 GateCase::kEngineDead,
                 false,
                 3,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}},
        GateCase{"loop_hung_ignores_gate",
                 GateCase::kLoopHung,
                 false,
                 3,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}},
        GateCase{"exit_ignores_gate",
                 GateCase::kExit,
                 false,
                 3,
                 Phase::kRestartScheduled,
                 {A::kEjected, A::kHealthFailed, A::kRestartScheduled}}),
    [](const ::testing::TestParamInfo<GateCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(EjectionGateTest, HeldBackOncePerStreakThenReevaluated) {
  PolicyOptions o;
  o.failure_threshold = 3;
  Harness h(o);
  h.ok();
  const EjectionGate closed{false, "fleet thin"};
  EXPECT_EQ(actions(h.fail(ProbeStatus::kTimeout, closed)),
            std::vector<A>{A::kEjectionSuppressed});
  // Still failing, still held: no new record, the count goes on.
  EXPECT_TRUE(h.fail(ProbeStatus::kTimeout, closed).events.empty());
  EXPECT_TRUE(h.fail(ProbeStatus::kTimeout, closed).events.empty());
  EXPECT_EQ(h.policy().consecutive_failures(), 3);
  EXPECT_TRUE(h.policy().in_rotation());
  // The gate opens on the next failure: ejected and, past the threshold,
  // failed in one step.
  Transition t = h.fail(ProbeStatus::kTimeout, EjectionGate{});
  EXPECT_EQ(actions(t), (std::vector<A>{A::kEjected, A::kHealthFailed,
                                        A::kRestartScheduled}));
  EXPECT_FALSE(h.policy().ejection_suppressed());
}

TEST(EjectionGateTest, HealthyAnswerEndsTheStreak) {
  Harness h(PolicyOptions{});
  h.ok();
  const EjectionGate closed{false, "fleet thin"};
  EXPECT_EQ(actions(h.fail(ProbeStatus::kTimeout, closed)),
            std::vector<A>{A::kEjectionSuppressed});
  EXPECT_TRUE(h.ok().events.empty());
  EXPECT_FALSE(h.policy().ejection_suppressed());
  EXPECT_EQ(h.policy().consecutive_failures(), 0);
  EXPECT_EQ(actions(h.fail(ProbeStatus::kTimeout, closed)),
            std::vector<A>{A::kEjectionSuppressed});
}

TEST(EjectionGateTest, WorkersOutOfRotationNeverAsk) {
  PolicyOptions o;
  o.failure_threshold = 2;
  Harness h(o);
  h.ok();
  h.fail();  // ejected with the gate open
  const EjectionGate closed{false, "fleet thin"};
  // Already out: reaching the threshold fails it whatever the gate says.
  EXPECT_EQ(actions(h.fail(ProbeStatus::kTimeout, closed)),
            (std::vector<A>{A::kHealthFailed, A::kRestartScheduled}));
}

}  // namespace
}  // namespace mineru_health
