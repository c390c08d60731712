// Poller against real loopback servers, on a fake clock.
//
// The poller's own time (the probe schedule and its jitter, restart backoff,
// boot deadlines, the stability window, the retry backoff after its own I/O
// fails) moves only when a test moves it (Harness::advance, set_time), and
// each move returns once the poller thread has acted on the new time
// (PollerTestPeer::sync). So tests assert exact deadlines, "not a moment
// early" included, and never sleep.
//
// What stays real, waited for as events with a bound (EventLog::wait_for):
// the loopback servers' answers and curl's own timeouts (probe_timeout_s and
// friends, which curl measures in real time). One test runs the default
// steady clock, to check what production runs. The servers are plain POSIX
// sockets in test threads; nothing is asserted about how long anything took.
#include "mineru_health/poller.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loopback_server.h"
#include "poller_impl.h"

namespace mineru_health {
namespace {

using internal::PollerTestPeer;
using std::chrono::milliseconds;
using std::chrono::seconds;
using test_support::kHealthyBody;
using test_support::Mode;
using test_support::refused_url;
using test_support::TestServer;

HealthConfig test_config() {
  HealthConfig c;
  c.interval_s = 0.4;
  c.probe_timeout_s = 0.3;
  c.connect_timeout_s = 0.2;
  c.main_port_timeout_s = 0.3;
  c.failure_threshold = 2;
  c.backoff_base_s = 0.05;
  c.backoff_max_s = 0.2;
  c.max_attempts = 3;
  c.boot_timeout_s = 5;
  c.jitter = 0.1;
  return c;
}

ProbeExpectations mineru_expect() {
  ProbeExpectations e;
  e.protocol_version = 2;
  return e;
}

// Bounds every real-time wait: for the poller thread, a loopback answer or a
// curl timeout, never for the poller's own schedule. Generous for a loaded
// CI machine.
constexpr milliseconds kWaitLimit = seconds(10);

// --- events ------------------------------------------------------------------

using Events = std::vector<PollerEvent>;
using EventTest = std::function<bool(const PollerEvent&)>;

EventTest probe_of(const std::string& id) {
  return [id](const PollerEvent& e) {
    return e.kind == PollerEventKind::kProbe && e.worker_id == id && e.probe;
  };
}

EventTest probe_of(const std::string& id, ProbeStatus status) {
  return [id, status](const PollerEvent& e) {
    return probe_of(id)(e) && e.probe->status == status;
  };
}

// id "" = any worker.
EventTest audit_of(const std::string& id, AuditAction action) {
  return [id, action](const PollerEvent& e) {
    return e.kind == PollerEventKind::kAudit && e.audit &&
           (id.empty() || e.worker_id == id) && e.audit->action == action;
  };
}

EventTest restart_of(const std::string& id) {
  return [id](const PollerEvent& e) {
    return e.kind == PollerEventKind::kRestartRequested && e.worker_id == id;
  };
}

bool is_error(const PollerEvent& e) {
  return e.kind == PollerEventKind::kError;
}

std::size_t count_of(const Events& events, const EventTest& test,
                     std::size_t from = 0) {
  return static_cast<std::size_t>(std::count_if(
      events.begin() + static_cast<std::ptrdiff_t>(from), events.end(), test));
}

bool has(const Events& events, const EventTest& test) {
  return count_of(events, test) > 0;
}

const ProbeResult* first_probe(const Events& events, const std::string& id) {
  auto it = std::find_if(events.begin(), events.end(), probe_of(id));
  return it == events.end() ? nullptr : &*it->probe;
}

const ProbeResult* last_probe(const Events& events, const std::string& id) {
  auto it = std::find_if(events.rbegin(), events.rend(), probe_of(id));
  return it == events.rend() ? nullptr : &*it->probe;
}

// The events drained from a poller, in order.
class EventLog {
 public:
  explicit EventLog(Poller& poller) : poller_(poller) {}

  // Takes what is queued now.
  void collect() {
    for (PollerEvent& e : poller_.drain_events())
      events_.push_back(std::move(e));
  }

  // Collects until `n` events pass `test`, woken by the notify fd: for what
  // only real I/O brings (a loopback answer, a curl timeout). False after
  // kWaitLimit.
  bool wait_for(const EventTest& test, std::size_t n = 1) {
    const auto give_up = std::chrono::steady_clock::now() + kWaitLimit;
    for (int i = 0; i < 100000; ++i) {
      collect();
      if (count_of(events_, test) >= n) return true;
      const auto left = std::chrono::ceil<milliseconds>(
          give_up - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{poller_.notify_fd(), POLLIN, 0};
      poll(&p, 1, static_cast<int>(left.count()));
    }
    return false;
  }

  const Events& events() const { return events_; }

 private:
  Poller& poller_;
  Events events_;
};

// --- the harness -------------------------------------------------------------

// A steady clock that moves only when the test moves it. The poller thread
// reads it too, hence the lock.
class FakeClock {
 public:
  TimePoint now() const {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void set(TimePoint t) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = std::max(now_, t);  // steady: never back
  }
  void advance(Duration d) { set(now() + d); }

 private:
  mutable std::mutex mu_;
  TimePoint now_ = TimePoint{} + std::chrono::hours(1);
};

// A Poller on a FakeClock and the log of its events. Declare it after the
// servers it probes, so that it stops first.
struct Harness {
  explicit Harness(HealthConfig c = test_config(), std::uint64_t seed = 1)
      : config(c),
        poller(
            std::move(c), mineru_expect(), [this] { return clock.now(); },
            seed),
        log(poller) {}

  // Adds `targets` and starts the poller thread.
  void start(const std::vector<Target>& targets) {
    for (const Target& t : targets) poller.add_worker(t);
    poller.start();
  }

  TimePoint now() const { return clock.now(); }
  Duration interval() const { return internal::to_duration(config.interval_s); }

  // Moves the clock and returns once the poller thread has acted on the
  // new time, with the events that produced collected.
  void set_time(TimePoint t) {
    clock.set(t);
    EXPECT_TRUE(PollerTestPeer::sync(poller, kWaitLimit));
    log.collect();
  }
  void advance(Duration d) { set_time(now() + d); }

  std::optional<TimePoint> probe_due(const std::string& id) const {
    return PollerTestPeer::probe_due(poller, id);
  }

  // Moves the clock to when every one of `ids` is due for its next probe
  // (or leaves it, for a probe already in flight) and waits for a result of
  // each: real I/O on loopback. Returns with the events of their policy
  // calls collected too.
  void probe_round(const std::vector<std::string>& ids) {
    log.collect();
    TimePoint due = now();
    std::vector<std::size_t> before;
    for (const std::string& id : ids) {
      before.push_back(count_of(log.events(), probe_of(id)));
      if (std::optional<TimePoint> at = probe_due(id)) due = std::max(due, *at);
    }
    set_time(due);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(log.wait_for(probe_of(ids[i]), before[i] + 1)) << ids[i];
    }
    // A probe's audit events are queued under the poller's lock along with
    // it: once a call has had that lock, they are all there.
    (void)poller.stats();
    log.collect();
  }

  // One probe_round for `id`; its result.
  ProbeResult next_probe(const std::string& id) {
    probe_round({id});
    const ProbeResult* p = last_probe(log.events(), id);
    if (p == nullptr) {
      ADD_FAILURE() << "no probe of " << id;
      return {};
    }
    return *p;
  }

  // `id` has a restart due `backoff` from now: not asked for a moment
  // before, asked for then.
  void expect_restart_after(const std::string& id, milliseconds backoff) {
    const std::optional<double> in_s = status(id).next_restart_in_s;
    ASSERT_TRUE(in_s.has_value()) << id;
    EXPECT_DOUBLE_EQ(*in_s, std::chrono::duration<double>(backoff).count());
    const std::size_t before = count(restart_of(id));
    advance(backoff - milliseconds(1));
    EXPECT_EQ(count(restart_of(id)), before);
    advance(milliseconds(1));
    EXPECT_EQ(count(restart_of(id)), before + 1);
  }

  // Over the events collected so far.
  bool saw(const EventTest& test) const { return has(log.events(), test); }
  std::size_t count(const EventTest& test) const {
    return count_of(log.events(), test);
  }

  WorkerStatus status(const std::string& id) const {
    std::optional<WorkerStatus> s = poller.status(id);
    if (!s) {
      ADD_FAILURE() << "no worker " << id;
      return {};
    }
    return *s;
  }

  const HealthConfig config;
  FakeClock clock;  // before the poller, which reads it until it stops
  Poller poller;
  EventLog log;
};

std::vector<std::string> ids(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

// --- the poller's schedule and policy ----------------------------------------

TEST(PollerTest, RejectsBadConfig) {
  HealthConfig c = test_config();
  c.probe_timeout_s = c.interval_s;
  EXPECT_THROW(Poller(c, mineru_expect()), ConfigError);
}

TEST(PollerTest, HealthyWorkerEntersRotationOverKeptAliveConnection) {
  TestServer server(Mode::kHealthy);
  Harness h(test_config(), 42);
  h.start({{"w0", server.url(), false}});
  EXPECT_TRUE(h.poller.running());
  for (int i = 0; i < 3; ++i) h.probe_round({"w0"});
  const ProbeResult* p = first_probe(h.log.events(), "w0");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->healthy()) << p->detail;
  EXPECT_EQ(p->http_status, 200);
  EXPECT_EQ(p->load.max_concurrent_requests, 2);
  EXPECT_EQ(p->worker_id, "w0");
  EXPECT_GT(h.log.events().back().unix_time, 1.6e9);

  WorkerStatus s = h.status("w0");
  EXPECT_TRUE(s.in_rotation);
  EXPECT_EQ(s.phase, WorkerPhase::kHealthy);
  EXPECT_GE(s.probes, 3u);
  EXPECT_TRUE(s.last_latency_s.has_value());
  h.poller.stop();
  EXPECT_FALSE(h.poller.running());
  h.poller.stop();  // idempotent
  // Probes reused the connection instead of opening one each.
  EXPECT_GE(server.requests(), 3);
  EXPECT_LT(server.connections(), server.requests());
}

TEST(PollerTest, ProbesFollowTheJitteredInterval) {
  TestServer server(Mode::kHealthy);
  Harness h(test_config(), 3);
  h.poller.add_worker({"w", server.url(), false});
  // The first probe falls within one interval of add_worker, so a fleet
  // added at once is not probed in lock-step.
  std::optional<TimePoint> due = h.probe_due("w");
  ASSERT_TRUE(due.has_value());
  EXPECT_GE(*due, h.now());
  EXPECT_LT(*due, h.now() + h.interval());
  h.poller.start();
  const Duration shortest = internal::to_duration(0.4 * 0.9);
  const Duration longest = internal::to_duration(0.4 * 1.1);
  std::vector<Duration> gaps;
  for (int i = 0; i < 5; ++i) {
    due = h.probe_due("w");
    ASSERT_TRUE(due.has_value());
    // Not a moment early...
    h.set_time(*due - Duration(1));
    EXPECT_EQ(h.probe_due("w"), due);
    EXPECT_EQ(h.count(probe_of("w")), std::size_t(i));
    // ...and at once when due.
    EXPECT_TRUE(h.next_probe("w").healthy());
    // The next one is due a jittered interval after this one started.
    std::optional<TimePoint> next = h.probe_due("w");
    ASSERT_TRUE(next.has_value());
    gaps.push_back(*next - *due);
    EXPECT_GE(gaps.back(), shortest);
    EXPECT_LE(gaps.back(), longest);
  }
  EXPECT_NE(*std::min_element(gaps.begin(), gaps.end()),
            *std::max_element(gaps.begin(), gaps.end()));
}

TEST(PollerTest, EngineDeadRestartsThenRecoversOnNewUrl) {
  TestServer dying(Mode::kEngineDead);
  TestServer replacement(Mode::kHealthy);
  Harness h(test_config(), 7);
  h.start({{"local-0", dying.url(), true}});
  EXPECT_EQ(h.next_probe("local-0").status, ProbeStatus::kEngineDead);
  EXPECT_TRUE(h.saw(audit_of("local-0", AuditAction::kHealthFailed)));
  EXPECT_TRUE(h.saw(audit_of("local-0", AuditAction::kRestartScheduled)));
  h.expect_restart_after("local-0", milliseconds(50));  // backoff_base_s
  EXPECT_FALSE(h.status("local-0").in_rotation);
  EXPECT_EQ(h.status("local-0").phase, WorkerPhase::kRestarting);
  EXPECT_TRUE(h.status("local-0").awaiting_process);

  // The owner restarts the process and tells the poller where it listens.
  h.poller.set_url("local-0", replacement.url());
  EXPECT_FALSE(h.status("local-0").awaiting_process);
  ASSERT_TRUE(h.log.wait_for(audit_of("local-0", AuditAction::kAdmitted)));
  WorkerStatus s = h.status("local-0");
  EXPECT_EQ(s.phase, WorkerPhase::kHealthy);
  EXPECT_TRUE(s.in_rotation);
  EXPECT_EQ(s.url, replacement.url());
  EXPECT_EQ(s.probe_url, replacement.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(s.attempt, 0);
  EXPECT_EQ(s.last_cause, "engine_dead");
  // Counted as a success only after the stability window (600 s by
  // default), which runs from the admission: the clock has not moved since.
  ASSERT_TRUE(s.stable_in_s.has_value());
  EXPECT_DOUBLE_EQ(*s.stable_in_s, 600.0);
  EXPECT_FALSE(h.saw(audit_of("local-0", AuditAction::kRestartSucceeded)));
}

TEST(PollerTest, RestartSucceedsAfterTheStabilityWindow) {
  TestServer dying(Mode::kEngineDead);
  TestServer replacement(Mode::kHealthy);
  Harness h(test_config(), 8);  // the default window: 600 s
  h.start({{"local-0", dying.url(), true}});
  h.next_probe("local-0");
  h.expect_restart_after("local-0", milliseconds(50));
  h.poller.set_url("local-0", replacement.url());
  ASSERT_TRUE(h.log.wait_for(audit_of("local-0", AuditAction::kAdmitted)));
  h.advance(seconds(600) - milliseconds(1));
  EXPECT_FALSE(h.saw(audit_of("local-0", AuditAction::kRestartSucceeded)));
  EXPECT_TRUE(h.status("local-0").stable_in_s.has_value());
  h.advance(milliseconds(1));
  ASSERT_TRUE(h.saw(audit_of("local-0", AuditAction::kRestartSucceeded)));
  WorkerStatus s = h.status("local-0");
  EXPECT_TRUE(s.in_rotation);
  EXPECT_FALSE(s.stable_in_s.has_value());
  // Every event carries the worker's rotation after the policy call it
  // belongs to: the phase the last audit event of that call ends in.
  const Events& events = h.log.events();
  for (std::size_t i = 0; i < events.size(); ++i) {
    const PollerEvent& e = events[i];
    EXPECT_EQ(e.worker_id, "local-0");
    const bool last_of_run =
        i + 1 == events.size() || events[i + 1].kind != PollerEventKind::kAudit;
    if (e.audit && last_of_run) {
      EXPECT_EQ(e.in_rotation, e.audit->to == WorkerPhase::kHealthy)
          << to_string(e.audit->action);
    }
  }
}

TEST(PollerTest, ReplacementThatNeverAnswersFailsAtItsBootDeadline) {
  TestServer dying(Mode::kEngineDead);
  Harness h(test_config(), 83);  // boot_timeout_s = 5
  h.start({{"local-0", dying.url(), true}});
  h.next_probe("local-0");
  h.expect_restart_after("local-0", milliseconds(50));
  // The owner takes a second to start the new process, which never
  // listens: refused probes do not fail it, the boot deadline does, counted
  // from set_url (not from the request).
  h.advance(seconds(1));
  h.poller.set_url("local-0", refused_url());
  ASSERT_TRUE(h.status("local-0").boot_deadline_in_s.has_value());
  EXPECT_DOUBLE_EQ(*h.status("local-0").boot_deadline_in_s, 5.0);
  h.advance(seconds(5) - milliseconds(1));
  EXPECT_FALSE(h.saw(audit_of("local-0", AuditAction::kRestartFailed)));
  EXPECT_EQ(h.status("local-0").phase, WorkerPhase::kRestarting);
  h.advance(milliseconds(1));
  const auto failed =
      std::find_if(h.log.events().begin(), h.log.events().end(),
                   audit_of("local-0", AuditAction::kRestartFailed));
  ASSERT_NE(failed, h.log.events().end());
  EXPECT_EQ(failed->audit->cause, kCauseBootTimeout);
  EXPECT_EQ(h.status("local-0").phase, WorkerPhase::kRestartScheduled);
  EXPECT_EQ(h.status("local-0").attempt, 1);
  // The second attempt waits twice the base backoff. (last_cause may be a
  // refused probe's by now: probes go on while the restart waits.)
  h.expect_restart_after("local-0", milliseconds(100));
}

TEST(PollerTest, PlainUnavailableNeedsTheThreshold) {
  TestServer server(Mode::kHealthy);
  TestServer other(Mode::kHealthy);
  Harness h(test_config(), 1);
  // A second worker: the mass-ejection guard never ejects the last one in
  // rotation for non-definitive failures.
  h.start({{"remote", server.url(), false}, {"other", other.url(), false}});
  h.probe_round({"remote", "other"});
  ASSERT_TRUE(h.saw(probe_of("remote", ProbeStatus::kHealthy)));
  server.set_mode(Mode::kUnavailable);
  h.next_probe("remote");
  h.next_probe("remote");
  ASSERT_TRUE(h.saw(audit_of("remote", AuditAction::kHealthFailed)));
  // Ejected on the first 503, failed on the second; never restarted.
  int ejected_at = -1;
  int failed_at = -1;
  int unavailable_probes = 0;
  for (const PollerEvent& e : h.log.events()) {
    if (e.worker_id != "remote") continue;
    if (probe_of("remote", ProbeStatus::kHttpStatus)(e)) {
      ++unavailable_probes;
      EXPECT_EQ(e.probe->http_status, 503);
      EXPECT_NE(e.probe->detail.find("dispatcher down"), std::string::npos);
    }
    if (audit_of("remote", AuditAction::kEjected)(e)) {
      ejected_at = unavailable_probes;
    }
    if (audit_of("remote", AuditAction::kHealthFailed)(e)) {
      failed_at = unavailable_probes;
    }
    EXPECT_NE(e.kind, PollerEventKind::kRestartRequested);
  }
  EXPECT_EQ(ejected_at, 1);
  EXPECT_EQ(failed_at, 2);
  EXPECT_EQ(h.status("remote").phase, WorkerPhase::kFailed);

  server.set_mode(Mode::kHealthy);
  h.next_probe("remote");
  ASSERT_TRUE(h.saw(audit_of("remote", AuditAction::kRecovered)));
  EXPECT_TRUE(h.status("remote").in_rotation);
}

struct FailureCase {
  const char* name;
  Mode mode;
  ProbeStatus want;
};

class PollerFailureTest : public ::testing::TestWithParam<FailureCase> {};

// hang and slow_drip end on curl's timeout, in real time.
TEST_P(PollerFailureTest, ProbeFailsWithTheRightStatus) {
  const FailureCase& c = GetParam();
  TestServer server(c.mode);
  Harness h(test_config(), 3);
  h.start({{"w", server.url(), false}});
  const ProbeResult p = h.next_probe("w");
  EXPECT_EQ(to_string(p.status), std::string(to_string(c.want))) << p.detail;
  EXPECT_FALSE(p.detail.empty());
  h.poller.stop();  // must not wait for the hung or dripping server
}

INSTANTIATE_TEST_SUITE_P(
    Servers, PollerFailureTest,
    ::testing::Values(
        FailureCase{"hang", Mode::kHang, ProbeStatus::kTimeout},
        FailureCase{"close_mid_body", Mode::kCloseMidBody,
                    ProbeStatus::kTransportError},
        FailureCase{"slow_drip", Mode::kSlowDrip, ProbeStatus::kTimeout},
        FailureCase{"huge_body", Mode::kHugeBody, ProbeStatus::kBodyTooLarge},
        FailureCase{"redirect_not_followed", Mode::kRedirect,
                    ProbeStatus::kHttpStatus},
        FailureCase{"unavailable", Mode::kUnavailable,
                    ProbeStatus::kHttpStatus}),
    [](const ::testing::TestParamInfo<FailureCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(PollerTest, RefusedPortIsAConnectError) {
  Harness h(test_config(), 5);
  h.start({{"gone", refused_url(), false}});
  EXPECT_EQ(h.next_probe("gone").status, ProbeStatus::kConnectError);
}

TEST(PollerTest, EmptyUrlIsNotProbedUntilSet) {
  TestServer server(Mode::kHealthy);
  Harness h(test_config(), 9);
  h.start({{"later", "", true}, {"marker", server.url(), false}});
  // Past every first probe, and a few probes of another worker: "later"
  // has none and none is scheduled.
  h.advance(h.interval());
  h.next_probe("marker");
  h.next_probe("marker");
  EXPECT_EQ(first_probe(h.log.events(), "later"), nullptr);
  EXPECT_EQ(h.status("later").probes, 0u);
  EXPECT_FALSE(h.probe_due("later").has_value());
  // set_url probes it at once.
  h.poller.set_url("later", server.url());
  ASSERT_TRUE(h.log.wait_for(probe_of("later", ProbeStatus::kHealthy)));
  EXPECT_TRUE(h.status("later").in_rotation);
}

TEST(PollerTest, ReportsDriveThePolicy) {
  TestServer server(Mode::kHealthy);
  TestServer other(Mode::kHealthy);
  HealthConfig c = test_config();
  c.backoff_base_s = 0.1;
  c.max_attempts = 1;
  Harness h(c, 11);
  h.start({{"local-1", server.url(), true}, {"other", other.url(), false}});
  h.probe_round({"local-1", "other"});
  ASSERT_TRUE(h.saw(probe_of("local-1", ProbeStatus::kHealthy)));
  ASSERT_TRUE(h.status("local-1").in_rotation);

  // The process died: its port answers 503 (never healthy) until further
  // notice, so no probe can end the restart before the owner reports on it.
  // Reports act at once: their events are queued when the call returns.
  server.set_mode(Mode::kUnavailable);
  h.poller.report_process_exit("local-1", "exit code -9", -9);
  h.log.collect();
  ASSERT_TRUE(h.saw(audit_of("local-1", AuditAction::kEjected)));
  EXPECT_FALSE(h.status("local-1").in_rotation);
  EXPECT_EQ(h.status("local-1").last_exit_code, -9);
  EXPECT_EQ(h.status("local-1").last_cause, kCauseProcessExit);
  h.expect_restart_after("local-1", milliseconds(100));
  h.poller.report_restart_failed("local-1", "spawn: no such file");
  h.log.collect();
  ASSERT_TRUE(h.saw(audit_of("local-1", AuditAction::kGaveUp)));
  EXPECT_EQ(h.status("local-1").phase, WorkerPhase::kGaveUp);
  EXPECT_EQ(h.status("local-1").last_cause, kCauseRestartFailed);
  // Still probed while given up: a healthy answer brings it back.
  server.set_mode(Mode::kHealthy);
  h.next_probe("local-1");
  ASSERT_TRUE(h.saw(audit_of("local-1", AuditAction::kRecovered)));
  EXPECT_TRUE(h.status("local-1").in_rotation);

  h.poller.report_passive_failure("local-1", "EngineDeadError in task");
  h.log.collect();
  EXPECT_EQ(h.count(audit_of("local-1", AuditAction::kEjected)), 2u);
  EXPECT_EQ(h.status("local-1").last_cause, kCausePassiveFailure);
  // Unknown ids are ignored.
  h.poller.report_process_exit("nobody", "x");
  EXPECT_FALSE(h.poller.status("nobody").has_value());
}

// The metrics read the poller's own counts (worker_counters.h), not the
// events: they must agree with every probe and policy event it emitted.
TEST(PollerTest, CountersAgreeWithTheEventsEmitted) {
  TestServer server(Mode::kHealthy);
  HealthConfig c = test_config();
  c.backoff_base_s = 0.1;
  c.max_attempts = 1;
  Harness h(c, 13);
  h.start({{"local-1", server.url(), true}});
  h.probe_round({"local-1"});
  server.set_mode(Mode::kEngineDead);
  h.next_probe("local-1");
  h.poller.report_passive_failure("local-1", "EngineDeadError in task");
  h.poller.report_process_exit("local-1", "exit code -9", -9);
  h.log.collect();
  const WorkerCounters counters = h.status("local-1").counters;
  std::uint64_t probes = 0;
  for (const auto& [status, n] : counters.probes) probes += n;
  EXPECT_EQ(probes, h.count(probe_of("local-1")));
  EXPECT_EQ(counters.probes.at("healthy"),
            h.count(probe_of("local-1", ProbeStatus::kHealthy)));
  EXPECT_EQ(counters.probes.at("engine_dead"),
            h.count(probe_of("local-1", ProbeStatus::kEngineDead)));
  std::uint64_t in_buckets = 0;
  for (std::uint64_t n : counters.latency_counts) in_buckets += n;
  EXPECT_EQ(in_buckets, probes);
  ASSERT_TRUE(counters.last_probe_unix_time.has_value());
  std::uint64_t audits = 0;
  for (AuditAction action :
       {AuditAction::kHealthFailed, AuditAction::kRestartScheduled,
        AuditAction::kRestartSucceeded, AuditAction::kRestartFailed,
        AuditAction::kGaveUp, AuditAction::kRecovered, AuditAction::kEjected,
        AuditAction::kAdmitted, AuditAction::kEjectionSuppressed,
        AuditAction::kRestartRequested}) {
    const std::size_t seen = h.count(audit_of("local-1", action));
    const auto it = counters.audits.find(to_string(action));
    EXPECT_EQ(it == counters.audits.end() ? 0u : it->second, seen)
        << to_string(action);
    audits += seen;
  }
  EXPECT_GT(audits, 0u);
  std::uint64_t ejections = 0;
  for (const auto& [cause, n] : counters.ejections) ejections += n;
  EXPECT_EQ(ejections, h.count(audit_of("local-1", AuditAction::kEjected)));
}

TEST(PollerTest, RemovedWorkerStopsProducingEvents) {
  TestServer hung(Mode::kHang);
  TestServer healthy(Mode::kHealthy);
  HealthConfig c = test_config();
  // Long enough that the hung probe is surely still in flight when its
  // worker goes: removing the worker must drop it, not let it time out.
  c.main_port_timeout_s = 5;
  Harness h(c, 13);
  h.start({{"hung", hung.url(), false}, {"ok", healthy.url(), false}});
  h.advance(h.interval());  // both first probes start
  ASSERT_TRUE(h.log.wait_for(probe_of("ok", ProbeStatus::kHealthy)));
  h.poller.remove_worker("hung");
  const std::size_t seen = h.log.events().size();
  for (int i = 0; i < 3; ++i) h.next_probe("ok");
  for (std::size_t i = seen; i < h.log.events().size(); ++i) {
    EXPECT_NE(h.log.events()[i].worker_id, "hung");
  }
  EXPECT_EQ(h.poller.stats().in_flight, 0u);
  std::vector<WorkerStatus> all = h.poller.statuses();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].id, "ok");
  EXPECT_FALSE(h.poller.status("hung").has_value());
}

TEST(PollerTest, ReplacingAWorkerStartsItsPolicyAfresh) {
  TestServer dead(Mode::kUnavailable);
  TestServer healthy(Mode::kHealthy);
  Harness h(test_config(), 17);
  h.start({{"w", dead.url(), false}});
  h.next_probe("w");
  h.next_probe("w");
  ASSERT_TRUE(h.saw(audit_of("w", AuditAction::kHealthFailed)));
  h.poller.add_worker({"w", healthy.url(), false});
  EXPECT_EQ(h.status("w").phase, WorkerPhase::kStarting);
  EXPECT_TRUE(h.next_probe("w").healthy());
  EXPECT_TRUE(h.status("w").in_rotation);
}

TEST(PollerTest, StopAndStartAgain) {
  TestServer server(Mode::kHealthy);
  Harness h(test_config(), 19);
  h.start({{"w", server.url(), false}});
  h.poller.start();  // no second thread
  EXPECT_TRUE(h.next_probe("w").healthy());
  h.poller.stop();
  const std::uint64_t before = h.status("w").probes;
  h.poller.start();
  h.next_probe("w");
  EXPECT_GT(h.status("w").probes, before);
}

TEST(PollerTest, NotifyFdIsReadableOnlyWithEvents) {
  TestServer server(Mode::kHealthy);
  Harness h(test_config(), 23);
  pollfd p{h.poller.notify_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  h.start({{"w", server.url(), false}});
  // Past the first probe, without draining (Harness::advance would).
  h.clock.advance(h.interval());
  ASSERT_TRUE(PollerTestPeer::sync(h.poller, kWaitLimit));
  p.revents = 0;
  ASSERT_EQ(poll(&p, 1, static_cast<int>(kWaitLimit.count())), 1);
  EXPECT_FALSE(h.poller.drain_events().empty());
  h.poller.stop();
  p.revents = 0;
  // Whatever arrived between the drain and stop() is drained here; after that
  // the fd must be quiet.
  h.poller.drain_events();
  EXPECT_EQ(poll(&p, 1, 0), 0);
}

// The hung probes end on curl's timeout, in real time.
TEST(PollerTest, ConcurrencyCapStillProbesEveryone) {
  TestServer hung(Mode::kHang);
  TestServer healthy(Mode::kHealthy);
  HealthConfig c = test_config();
  c.concurrency = 1;
  Harness h(c, 29);
  for (const std::string& id : ids("hung", 3))
    h.poller.add_worker({id, hung.url(), false});
  h.start({{"ok", healthy.url(), false}});
  h.advance(h.interval());  // every first probe is due
  ASSERT_TRUE(h.log.wait_for(probe_of("ok", ProbeStatus::kHealthy)));
}

// --- sweep (no clock: one round of real transfers) ---------------------------

TEST(SweepTest, ProbesEveryTargetInOrder) {
  TestServer healthy(Mode::kHealthy);
  TestServer dead(Mode::kEngineDead);
  TestServer hung(Mode::kHang);
  TestServer huge(Mode::kHugeBody);
  std::vector<Target> targets = {
      {"a", healthy.url(), false},
      {"b", dead.url(), false},
      {"c", hung.url(), false},
      {"d", refused_url(), false},
      {"e", "", false},
      {"f", healthy.url() + "/", false},
      {"g", huge.url(), false},
      {"h", "ftp://127.0.0.1:1", false},
  };
  SweepStats stats;
  std::vector<ProbeResult> results =
      Poller::sweep(targets, test_config(), mineru_expect(), &stats);
  ASSERT_EQ(results.size(), targets.size());
  const ProbeStatus want[] = {
      ProbeStatus::kHealthy,        ProbeStatus::kEngineDead,
      ProbeStatus::kTimeout,        ProbeStatus::kConnectError,
      ProbeStatus::kTransportError, ProbeStatus::kHealthy,
      ProbeStatus::kBodyTooLarge,   ProbeStatus::kTransportError,
  };
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].worker_id, targets[i].id);
    EXPECT_EQ(to_string(results[i].status), std::string(to_string(want[i])))
        << targets[i].id << ": " << results[i].detail;
  }
  EXPECT_EQ(stats.probes, targets.size());
  EXPECT_EQ(stats.healthy, 2u);
  EXPECT_GT(stats.wall_s, 0.0);
}

TEST(SweepTest, SmallCapAndManyTargets) {
  TestServer healthy(Mode::kHealthy);
  HealthConfig c = test_config();
  c.concurrency = 3;
  std::vector<Target> targets;
  for (const std::string& id : ids("w", 40))
    targets.push_back({id, healthy.url(), false});
  SweepStats stats;
  std::vector<ProbeResult> results =
      Poller::sweep(targets, c, mineru_expect(), &stats);
  EXPECT_EQ(stats.healthy, 40u);
}

TEST(SweepTest, ConfigExpectedStatusWins) {
  TestServer healthy(Mode::kHealthy);
  HealthConfig c = test_config();
  c.expected_status = "ok";
  std::vector<ProbeResult> results =
      Poller::sweep({{"a", healthy.url(), false}}, c, mineru_expect());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status, ProbeStatus::kUnexpectedStatus);
}

// --- configuration -----------------------------------------------------------

struct BadConfigCase {
  const char* name;
  std::function<void(HealthConfig&)> change;
  const char* variable;
};

class PollerConfigTest : public ::testing::TestWithParam<BadConfigCase> {};

TEST_P(PollerConfigTest, RefusesNamingTheVariable) {
  HealthConfig c = test_config();
  GetParam().change(c);
  try {
    Poller poller(c, mineru_expect());
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.variable(), GetParam().variable) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, PollerConfigTest,
    ::testing::Values(
        BadConfigCase{"timeout_not_below_interval",
                      [](HealthConfig& c) { c.probe_timeout_s = c.interval_s; },
                      "MINERU_ROUTER_HEALTH_TIMEOUT_S"},
        BadConfigCase{"main_port_timeout_zero",
                      [](HealthConfig& c) { c.main_port_timeout_s = 0; },
                      "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S"},
        BadConfigCase{"main_port_timeout_nan",
                      [](HealthConfig& c) { c.main_port_timeout_s = NAN; },
                      "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S"},
        BadConfigCase{"main_port_timeout_over_a_day",
                      [](HealthConfig& c) { c.main_port_timeout_s = 86401; },
                      "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S"},
        BadConfigCase{"main_port_timeout_below_connect",
                      [](HealthConfig& c) { c.main_port_timeout_s = 0.1; },
                      "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S"},
        BadConfigCase{"stable_window_negative",
                      [](HealthConfig& c) { c.stable_window_s = -1; },
                      "MINERU_ROUTER_HEALTH_STABLE_WINDOW_S"},
        BadConfigCase{"stable_window_inf",
                      [](HealthConfig& c) { c.stable_window_s = INFINITY; },
                      "MINERU_ROUTER_HEALTH_STABLE_WINDOW_S"},
        BadConfigCase{"stable_window_over_a_day",
                      [](HealthConfig& c) { c.stable_window_s = 86401; },
                      "MINERU_ROUTER_HEALTH_STABLE_WINDOW_S"},
        BadConfigCase{"ejection_percent_negative",
                      [](HealthConfig& c) { c.max_ejection_percent = -1; },
                      "MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT"},
        BadConfigCase{"ejection_percent_over_100",
                      [](HealthConfig& c) { c.max_ejection_percent = 101; },
                      "MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT"}),
    [](const ::testing::TestParamInfo<BadConfigCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(PollerConfigTest, NewFieldsHaveTheirDefaultsAndBounds) {
  HealthConfig c;
  EXPECT_EQ(c.main_port_timeout_s, 60.0);
  EXPECT_EQ(c.stable_window_s, 600.0);
  EXPECT_EQ(c.max_ejection_percent, 50);
  c.stable_window_s = 0;  // confirm at the first healthy answer
  c.max_ejection_percent = 0;
  c.main_port_timeout_s = 86400;  // may exceed interval_s
  EXPECT_NO_THROW(validate(c));
}

// --- endpoints ---------------------------------------------------------------

std::string native_body(const std::string& extra) {
  return R"({"status":"healthy","version":"3.4.4","protocol_version":2,)"
         R"("queued_tasks":0,"processing_tasks":1,"completed_tasks":0,)"
         R"("failed_tasks":0,"max_concurrent_requests":2,)"
         R"("processing_window_size":1,"endpoint":"native",)"
         R"("loop_lag_s":3.5,"loop_hung":false,"engine_calls_in_flight":2,)"
         R"("seconds_since_progress":0.25,"engine_dead":false)" +
         extra + "}";
}

std::string advertising_body(int port) {
  return std::string(kHealthyBody).substr(0, std::strlen(kHealthyBody) - 1) +
         R"(,"native_health_port":)" + std::to_string(port) + "}";
}

EventTest probe_on(const std::string& id, ProbeEndpoint endpoint) {
  return [id, endpoint](const PollerEvent& e) {
    return probe_of(id)(e) && e.probe->endpoint == endpoint;
  };
}

TEST(PollerEndpointTest, ExplicitHealthUrlIsProbedWithItsFigures) {
  TestServer main_port(Mode::kHang);  // never asked
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  Harness h(test_config(), 31);
  h.start({{"local-0", main_port.url(), true, native.url() + "/health"}});
  const ProbeResult p = h.next_probe("local-0");
  EXPECT_TRUE(p.healthy()) << p.detail;
  EXPECT_EQ(p.endpoint, ProbeEndpoint::kNative);
  EXPECT_EQ(p.url, native.url() + "/health");
  EXPECT_EQ(p.loop_lag_s, 3.5);
  EXPECT_EQ(p.engine_calls_in_flight, 2);
  EXPECT_EQ(p.seconds_since_progress, 0.25);
  WorkerStatus s = h.status("local-0");
  EXPECT_EQ(s.probe_url, native.url() + "/health");
  EXPECT_EQ(s.health_url, native.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kNative);
  ASSERT_TRUE(s.last_probe.has_value());
  EXPECT_EQ(s.last_probe->loop_lag_s, 3.5);
  EXPECT_EQ(main_port.requests(), 0);
}

TEST(PollerEndpointTest, LoopHungIsDefinitive) {
  TestServer native(Mode::kHealthy);
  native.set_custom(
      503, R"({"status":"unhealthy","endpoint":"native","loop_hung":true,)"
           R"("loop_lag_s":90.0,"engine_dead":false,"rule":"loop_hang",)"
           R"("category":"loop_hung"})");
  HealthConfig c = test_config();
  c.failure_threshold = 10;  // only a definitive answer fails it at once
  Harness h(c, 37);
  h.start({{"local-0", "", true, native.url() + "/health"}});
  const ProbeResult p = h.next_probe("local-0");
  EXPECT_EQ(p.status, ProbeStatus::kLoopHung);
  EXPECT_EQ(p.loop_lag_s, 90.0);
  EXPECT_EQ(h.status("local-0").last_cause, "loop_hung");
  EXPECT_EQ(h.status("local-0").phase, WorkerPhase::kRestartScheduled);
  h.expect_restart_after("local-0", milliseconds(50));
}

// The native endpoint's misses end on curl's timeout, in real time.
TEST(PollerEndpointTest, AdvertisedPortIsDiscoveredThenFallsBackToMain) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  main_port.set_custom(200, advertising_body(native.port()));
  TestServer other(Mode::kHealthy);
  Harness h(test_config(), 41);
  h.start({{"remote", main_port.url(), false}, {"other", other.url(), false}});
  h.probe_round({"remote", "other"});
  h.next_probe("remote");
  h.next_probe("remote");
  ASSERT_EQ(h.count(probe_on("remote", ProbeEndpoint::kNative)), 2u);
  const std::string native_url =
      "http://127.0.0.1:" + std::to_string(native.port()) + "/health";
  WorkerStatus s = h.status("remote");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kNative);
  EXPECT_EQ(s.probe_url, native_url);
  EXPECT_EQ(s.health_url, "");
  EXPECT_TRUE(s.in_rotation);
  // The first probe went to the main port, which advertised the port.
  const ProbeResult* first = first_probe(h.log.events(), "remote");
  EXPECT_EQ(first->endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(first->native_health_port, native.port());

  // The native endpoint stops answering: after failure_threshold misses
  // the worker is probed on its main port again, which rediscovers it.
  const int main_before = main_port.requests();
  native.set_mode(Mode::kHang);
  EXPECT_EQ(h.next_probe("remote").status, ProbeStatus::kTimeout);
  EXPECT_EQ(h.next_probe("remote").status, ProbeStatus::kTimeout);
  EXPECT_EQ(main_port.requests(), main_before);
  EXPECT_EQ(h.next_probe("remote").endpoint, ProbeEndpoint::kMain);
  EXPECT_GT(main_port.requests(), main_before);
  const std::size_t misses = h.count(probe_of("remote", ProbeStatus::kTimeout));
  EXPECT_EQ(misses, 2u);  // failure_threshold
}

TEST(PollerEndpointTest, AnAnswerThatIsNotHealthyKeepsTheNativeEndpoint) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  main_port.set_custom(200, advertising_body(native.port()));
  TestServer other(Mode::kHealthy);
  Harness h(test_config(), 43);
  h.start({{"remote", main_port.url(), false}, {"other", other.url(), false}});
  h.probe_round({"remote", "other"});
  ASSERT_EQ(h.status("remote").endpoint, ProbeEndpoint::kNative);
  const int main_before = main_port.requests();
  native.set_custom(503, R"({"status":"starting","endpoint":"native"})");
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(h.next_probe("remote").healthy());
  EXPECT_TRUE(h.saw(audit_of("remote", AuditAction::kHealthFailed)));
  EXPECT_EQ(main_port.requests(), main_before);
  EXPECT_EQ(h.status("remote").endpoint, ProbeEndpoint::kNative);
}

// The server answers after 500 ms of real time.
TEST(PollerEndpointTest, SlowMainPortGetsItsOwnTimeoutAndOneProbeInFlight) {
  TestServer slow(Mode::kSlowHealthy);
  HealthConfig c = test_config();
  c.main_port_timeout_s = 5;  // above interval_s: allowed
  Harness h(c, 47);
  h.start({{"busy", slow.url(), false}});
  h.advance(h.interval());  // the first probe starts
  // Its next one falls due while it is in flight: not started beside it,
  // but as soon as it ends (the clock does not move meanwhile).
  h.advance(3 * h.interval());
  EXPECT_FALSE(h.probe_due("busy").has_value());
  ASSERT_TRUE(h.log.wait_for(probe_of("busy"), 2));
  h.next_probe("busy");
  EXPECT_EQ(h.count(probe_of("busy")), 3u);
  for (const PollerEvent& e : h.log.events()) {
    if (e.kind != PollerEventKind::kProbe) continue;
    EXPECT_TRUE(e.probe->healthy()) << e.probe->detail;
    EXPECT_EQ(e.probe->endpoint, ProbeEndpoint::kMain);
  }
  EXPECT_EQ(slow.max_concurrent(), 1);
  EXPECT_TRUE(h.status("busy").in_rotation);
}

TEST(PollerEndpointTest, SetUrlReplacesBothUrls) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  Harness h(test_config(), 53);
  h.poller.add_worker({"local-0", "", true});
  h.poller.set_url("local-0", main_port.url(), native.url() + "/health");
  WorkerStatus s = h.status("local-0");
  EXPECT_EQ(s.probe_url, native.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kNative);
  h.poller.set_url("local-0", main_port.url());
  s = h.status("local-0");
  EXPECT_EQ(s.probe_url, main_port.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(s.health_url, "");
  h.poller.set_url("local-0", "");
  EXPECT_EQ(h.status("local-0").probe_url, "");
}

// --- mass-ejection guard -----------------------------------------------------

// A fleet of `n` restartable workers, each on its own healthy server, all
// probed once and in rotation.
struct Fleet {
  Fleet(int n, std::uint64_t seed) : names(ids("w", n)) {
    for (int i = 0; i < n; ++i)
      servers.push_back(std::make_unique<TestServer>(Mode::kHealthy));
    harness = std::make_unique<Harness>(test_config(), seed);
    for (int i = 0; i < n; ++i)
      harness->poller.add_worker({names[i], servers[i]->url(), true});
    harness->poller.start();
    harness->probe_round(names);
    EXPECT_EQ(harness->poller.stats().in_rotation, names.size());
  }
  // Every server answers as `mode` from now on; one probe of each.
  void turn(Mode mode) {
    for (auto& server : servers) server->set_mode(mode);
    harness->probe_round(names);
  }
  std::size_t audits(AuditAction action) const {
    return harness->count(audit_of("", action));
  }

  std::vector<std::string> names;
  std::vector<std::unique_ptr<TestServer>> servers;
  std::unique_ptr<Harness> harness;  // declared last: stops first
};

// The timeouts are curl's, in real time (all four at once).
TEST(PollerGuardTest, HungFleetKeepsHalfInRotation) {
  Fleet fleet(4, 59);
  fleet.turn(Mode::kHang);
  EXPECT_EQ(fleet.audits(AuditAction::kEjected), 2u);
  EXPECT_EQ(fleet.audits(AuditAction::kEjectionSuppressed), 2u);
  // More timeouts: the guard holds (50 % of 4 = 2 out).
  fleet.turn(Mode::kHang);
  fleet.turn(Mode::kHang);
  EXPECT_EQ(fleet.audits(AuditAction::kEjected), 2u);
  Harness& h = *fleet.harness;
  const PollerStats stats = h.poller.stats();
  EXPECT_EQ(stats.in_rotation, 2u);
  EXPECT_EQ(stats.ejections_suppressed, 2u);  // once per failure streak
  int held = 0;
  for (const WorkerStatus& s : h.poller.statuses()) {
    if (s.in_rotation) {
      EXPECT_TRUE(s.ejection_suppressed);
      EXPECT_GE(s.consecutive_failures, 1);
      ++held;
    }
  }
  EXPECT_EQ(held, 2);
  for (const PollerEvent& e : h.log.events()) {
    if (audit_of("", AuditAction::kEjectionSuppressed)(e)) {
      EXPECT_NE(e.audit->reason.find("max_ejection_percent=50"),
                std::string::npos)
          << e.audit->reason;
      EXPECT_EQ(e.audit->cause, "timeout");
    }
  }
}

TEST(PollerGuardTest, DefinitiveFailuresAreNeverHeldBack) {
  Fleet fleet(2, 61);
  fleet.turn(Mode::kEngineDead);
  EXPECT_EQ(fleet.audits(AuditAction::kEjected), 2u);
  EXPECT_EQ(fleet.audits(AuditAction::kEjectionSuppressed), 0u);
  EXPECT_EQ(fleet.harness->poller.stats().in_rotation, 0u);
}

TEST(PollerGuardTest, TheLastWorkersOwnVerdictIsNotHeldBack) {
  // A worker's own engine-dead verdict seen in traffic is as definitive as
  // its /health saying so: the last worker in rotation leaves it at once and
  // its restart is scheduled, instead of taking work until its next probe.
  Fleet fleet(1, 67);
  Harness& h = *fleet.harness;
  EXPECT_TRUE(h.saw(probe_of("w0", ProbeStatus::kHealthy)));
  h.poller.report_passive_failure("w0", "task failed: EngineDeadError?");
  h.log.collect();
  ASSERT_TRUE(h.saw(audit_of("w0", AuditAction::kEjected)));
  EXPECT_FALSE(h.saw(audit_of("w0", AuditAction::kEjectionSuppressed)));
  EXPECT_FALSE(h.status("w0").in_rotation);
}

// --- the poller's own I/O ----------------------------------------------------

TEST(PollerIoTest, PersistentLoopErrorIsReportedAndDoesNotSpin) {
  TestServer server(Mode::kHealthy);
  // When the fault hook ran: each time, one try of the loop. (Declared
  // before the poller, whose thread calls the hook until it stops.)
  std::mutex mu;
  std::vector<TimePoint> tries;
  const std::string fault = "epoll_wait: Bad file descriptor";
  Harness h(test_config(), 71);
  h.start({{"w", server.url(), false}});
  EXPECT_TRUE(h.next_probe("w").healthy());
  auto tried = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return tries;
  };
  internal::PollerTestPeer::inject_io_fault(h.poller, [&] {
    std::lock_guard<std::mutex> lock(mu);
    tries.push_back(h.now());
    return fault;
  });
  const TimePoint failed_at = h.now();
  h.advance(Duration(0));
  ASSERT_EQ(tried().size(), 1u);
  EXPECT_EQ(tried()[0], failed_at);
  // Woken again and again, it tries nothing until its backoff is up: a busy
  // loop would call the hook at every wake-up.
  h.advance(Duration(0));
  h.advance(Duration(0));
  EXPECT_EQ(tried().size(), 1u);
  // Retries after 100 ms, doubling to 5 s, each not a moment early.
  TimePoint at = failed_at;
  for (int ms : {100, 200, 400, 800, 1600, 3200, 5000, 5000}) {
    const std::size_t n = tried().size();
    h.advance(milliseconds(ms - 1));
    EXPECT_EQ(tried().size(), n) << ms;
    h.advance(milliseconds(1));
    at += milliseconds(ms);
    ASSERT_EQ(tried().size(), n + 1) << ms;
    EXPECT_EQ(tried().back(), at) << ms;
  }
  PollerStats stats = h.poller.stats();
  EXPECT_TRUE(stats.io_failing);
  EXPECT_EQ(stats.io_errors, 9u);
  EXPECT_EQ(stats.consecutive_io_errors, 9u);
  EXPECT_EQ(stats.last_io_error, fault);
  // Never hidden, never a flood: one event a second at most (the errors at
  // 0, 1.5, 3.1, 6.3, 11.3 and 16.3 s of the 9).
  EXPECT_EQ(h.count(is_error), 6u);
  const PollerEvent& error =
      *std::find_if(h.log.events().begin(), h.log.events().end(), is_error);
  EXPECT_EQ(error.error, fault);
  EXPECT_EQ(error.worker_id, "");
  EXPECT_FALSE(error.probe.has_value());
  EXPECT_FALSE(error.audit.has_value());
  // Not the worker's fault: still in rotation, no failure counted.
  EXPECT_TRUE(h.status("w").in_rotation);
  EXPECT_EQ(h.status("w").consecutive_failures, 0);

  // Mended: the next retry (5 s on) rebuilds the driver and probing resumes.
  const std::size_t probes_seen = h.count(probe_of("w"));
  internal::PollerTestPeer::inject_io_fault(h.poller, nullptr);
  h.advance(seconds(5));
  h.next_probe("w");
  h.next_probe("w");
  EXPECT_GE(h.count(probe_of("w")), probes_seen + 2);
  stats = h.poller.stats();
  EXPECT_FALSE(stats.io_failing);
  EXPECT_EQ(stats.consecutive_io_errors, 0u);
  EXPECT_EQ(stats.driver_rebuilds, 9u);

  // stop() ends a retry wait at once (this clock would never end it).
  internal::PollerTestPeer::inject_io_fault(h.poller, [&] { return fault; });
  h.advance(Duration(0));
  EXPECT_TRUE(h.poller.stats().io_failing);
  h.poller.stop();
  EXPECT_FALSE(h.poller.running());
}

TEST(PollerIoTest, StatsCountProbesAndCap) {
  TestServer server(Mode::kHealthy);
  HealthConfig c = test_config();
  c.concurrency = 3;
  Harness h(c, 73);
  const std::vector<std::string> names = ids("w", 5);
  for (const std::string& id : names)
    h.poller.add_worker({id, server.url(), false});
  h.poller.start();
  h.probe_round(names);
  h.probe_round(names);
  PollerStats stats = h.poller.stats();
  EXPECT_GE(stats.probes_finished, 10u);
  EXPECT_EQ(stats.workers, 5u);
  EXPECT_EQ(stats.concurrency_cap, 3u);
  EXPECT_GE(stats.probes_started, stats.probes_finished);
  EXPECT_GT(stats.loop_iterations, 0u);
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_FALSE(stats.io_failing);
}

// The default clock, which nothing moves but time: the poller probes on its
// own and retries its own I/O after a real backoff. The one test on wall
// time (two intervals of 0.2 s and one retry of 0.1 s), for what
// production runs.
TEST(PollerRealClockTest, ProbesAndRetriesOnTheSteadyClock) {
  TestServer server(Mode::kHealthy);
  HealthConfig c = test_config();
  c.interval_s = 0.2;
  c.probe_timeout_s = 0.15;
  c.main_port_timeout_s = 0.15;
  c.connect_timeout_s = 0.1;
  std::atomic<bool> failed{false};  // outlives the poller thread
  Poller poller(c, mineru_expect());
  poller.add_worker({"w", server.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_for(probe_of("w", ProbeStatus::kHealthy), 2));
  internal::PollerTestPeer::inject_io_fault(poller, [&failed] {
    return failed.exchange(true)
               ? std::string()
               : std::string("epoll_wait: Bad file descriptor");
  });
  const std::size_t probes = count_of(log.events(), probe_of("w"));
  ASSERT_TRUE(log.wait_for(is_error));
  ASSERT_TRUE(log.wait_for(probe_of("w"), probes + 2));
  EXPECT_EQ(poller.stats().driver_rebuilds, 1u);
}

TEST(FdLimitTest, PollerNeverChangesTheLimitAndRaiseDoes) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  {
    TestServer server(Mode::kHealthy);
    Harness h(test_config(), 79);
    for (const std::string& id : ids("w", 50))
      h.poller.add_worker({id, server.url(), false});
    h.poller.start();
    EXPECT_TRUE(h.next_probe("w0").healthy());
  }
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, before.rlim_cur);

  if (before.rlim_max != RLIM_INFINITY && before.rlim_max > 600) {
    rlimit lowered = before;
    lowered.rlim_cur = 512;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
    FdLimit raised = raise_fd_limit(300);
    EXPECT_TRUE(raised.raised) << raised.error;
    EXPECT_EQ(raised.soft_before, 512u);
    EXPECT_EQ(raised.soft, 300u + kReservedFds);
    EXPECT_EQ(raised.hard, static_cast<std::uint64_t>(before.rlim_max));
    // Enough already: nothing to do, never lowered.
    FdLimit again = raise_fd_limit(10);
    EXPECT_FALSE(again.raised);
    EXPECT_EQ(again.soft, 300u + kReservedFds);
    // More than the hard limit: capped at it.
    FdLimit capped = raise_fd_limit(static_cast<std::size_t>(before.rlim_max));
    EXPECT_EQ(capped.soft, static_cast<std::uint64_t>(before.rlim_max));
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
  }
}

TEST(PollerEventKindTest, Names) {
  EXPECT_STREQ(to_string(PollerEventKind::kProbe), "probe");
  EXPECT_STREQ(to_string(PollerEventKind::kAudit), "audit");
  EXPECT_STREQ(to_string(PollerEventKind::kRestartRequested),
               "restart_requested");
  EXPECT_STREQ(to_string(PollerEventKind::kError), "error");
}

}  // namespace
}  // namespace mineru_health
