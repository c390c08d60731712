// Poller against real loopback servers. The servers are plain POSIX sockets
// in test threads; every wait is bounded and only waits for events (no
// assertion is about how long something took).
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
#include <string>
#include <thread>
#include <vector>

#include "loopback_server.h"
#include "poller_impl.h"

namespace mineru_health {
namespace {

using test_support::kHealthyBody;
using test_support::Mode;
using test_support::refused_url;
using test_support::TestServer;

using Clock = std::chrono::steady_clock;

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

// Collects events until `done` holds or 10 s pass (a generous bound for a
// loaded CI machine; nothing is asserted about the time taken).
class EventLog {
 public:
  explicit EventLog(Poller& poller) : poller_(poller) {}

  bool wait_until(
      const std::function<bool(const std::vector<PollerEvent>&)>& done,
      std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto deadline = Clock::now() + limit;
    for (int i = 0; i < 10000; ++i) {
      if (done(events_)) return true;
      if (Clock::now() >= deadline) return false;
      pollfd p{poller_.notify_fd(), POLLIN, 0};
      poll(&p, 1, 50);
      for (PollerEvent& e : poller_.drain_events())
        events_.push_back(std::move(e));
    }
    return done(events_);
  }

  const std::vector<PollerEvent>& events() const { return events_; }

 private:
  Poller& poller_;
  std::vector<PollerEvent> events_;
};

auto has_probe(const std::string& id, ProbeStatus status) {
  return [id, status](const std::vector<PollerEvent>& events) {
    return std::any_of(events.begin(), events.end(), [&](const PollerEvent& e) {
      return e.kind == PollerEventKind::kProbe && e.worker_id == id &&
             e.probe && e.probe->status == status;
    });
  };
}

auto has_audit(const std::string& id, AuditAction action) {
  return [id, action](const std::vector<PollerEvent>& events) {
    return std::any_of(events.begin(), events.end(), [&](const PollerEvent& e) {
      return e.kind == PollerEventKind::kAudit && e.worker_id == id &&
             e.audit && e.audit->action == action;
    });
  };
}

auto has_restart_request(const std::string& id) {
  return [id](const std::vector<PollerEvent>& events) {
    return std::any_of(events.begin(), events.end(), [&](const PollerEvent& e) {
      return e.kind == PollerEventKind::kRestartRequested && e.worker_id == id;
    });
  };
}

const ProbeResult* first_probe(const std::vector<PollerEvent>& events,
                               const std::string& id) {
  for (const PollerEvent& e : events) {
    if (e.kind == PollerEventKind::kProbe && e.worker_id == id && e.probe)
      return &*e.probe;
  }
  return nullptr;
}

WorkerStatus status_of(const Poller& poller, const std::string& id) {
  for (const WorkerStatus& s : poller.statuses()) {
    if (s.id == id) return s;
  }
  ADD_FAILURE() << "no worker " << id;
  return {};
}

TEST(PollerTest, RejectsBadConfig) {
  HealthConfig c = test_config();
  c.probe_timeout_s = c.interval_s;
  EXPECT_THROW(Poller(c, mineru_expect()), ConfigError);
}

TEST(PollerTest, HealthyWorkerEntersRotationOverKeptAliveConnection) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 42);
  poller.add_worker({"w0", server.url(), false});
  poller.start();
  EXPECT_TRUE(poller.running());
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const PollerEvent& e) {
                           return e.kind == PollerEventKind::kProbe;
                         }) >= 3;
  }));
  const ProbeResult* p = first_probe(log.events(), "w0");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->healthy()) << p->detail;
  EXPECT_EQ(p->http_status, 200);
  EXPECT_EQ(p->load.max_concurrent_requests, 2);
  EXPECT_EQ(p->worker_id, "w0");
  EXPECT_GT(log.events().back().unix_time, 1.6e9);

  WorkerStatus s = status_of(poller, "w0");
  EXPECT_TRUE(s.in_rotation);
  EXPECT_EQ(s.phase, WorkerPhase::kHealthy);
  EXPECT_GE(s.probes, 3u);
  EXPECT_TRUE(s.last_latency_s.has_value());
  poller.stop();
  EXPECT_FALSE(poller.running());
  poller.stop();  // idempotent
  // Probes reused the connection instead of opening one each.
  EXPECT_GE(server.requests(), 3);
  EXPECT_LT(server.connections(), server.requests());
}

TEST(PollerTest, EngineDeadRestartsThenRecoversOnNewUrl) {
  TestServer dying(Mode::kEngineDead);
  TestServer replacement(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 7);
  poller.add_worker({"local-0", dying.url(), true});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_restart_request("local-0")));
  EXPECT_TRUE(has_probe("local-0", ProbeStatus::kEngineDead)(log.events()));
  EXPECT_TRUE(has_audit("local-0", AuditAction::kHealthFailed)(log.events()));
  EXPECT_TRUE(
      has_audit("local-0", AuditAction::kRestartScheduled)(log.events()));
  EXPECT_FALSE(status_of(poller, "local-0").in_rotation);

  EXPECT_EQ(status_of(poller, "local-0").phase, WorkerPhase::kRestarting);
  EXPECT_TRUE(status_of(poller, "local-0").awaiting_process);

  // The owner restarts the process and tells the poller where it listens.
  poller.set_url("local-0", replacement.url());
  EXPECT_FALSE(status_of(poller, "local-0").awaiting_process);
  ASSERT_TRUE(log.wait_until(has_audit("local-0", AuditAction::kAdmitted)));
  WorkerStatus s = status_of(poller, "local-0");
  EXPECT_EQ(s.phase, WorkerPhase::kHealthy);
  EXPECT_TRUE(s.in_rotation);
  EXPECT_EQ(s.url, replacement.url());
  EXPECT_EQ(s.probe_url, replacement.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(s.attempt, 0);
  EXPECT_EQ(s.last_cause, "engine_dead");
  // Counted as a success only after the stability window.
  ASSERT_TRUE(s.stable_in_s.has_value());
  EXPECT_GT(*s.stable_in_s, 500.0);
  EXPECT_FALSE(
      has_audit("local-0", AuditAction::kRestartSucceeded)(log.events()));
}

TEST(PollerTest, RestartSucceedsAfterTheStabilityWindow) {
  TestServer dying(Mode::kEngineDead);
  TestServer replacement(Mode::kHealthy);
  HealthConfig c = test_config();
  c.stable_window_s = 0.5;
  Poller poller(c, mineru_expect(), SteadyClock::now, 8);
  poller.add_worker({"local-0", dying.url(), true});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_restart_request("local-0")));
  poller.set_url("local-0", replacement.url());
  ASSERT_TRUE(
      log.wait_until(has_audit("local-0", AuditAction::kRestartSucceeded)));
  WorkerStatus s = status_of(poller, "local-0");
  EXPECT_TRUE(s.in_rotation);
  EXPECT_FALSE(s.stable_in_s.has_value());
  // Every event carries the worker's state after the transition it belongs
  // to, which the last audit event of a transition ends in.
  const std::vector<PollerEvent>& events = log.events();
  for (std::size_t i = 0; i < events.size(); ++i) {
    const PollerEvent& e = events[i];
    ASSERT_TRUE(e.worker.has_value());
    EXPECT_EQ(e.worker->id, "local-0");
    EXPECT_EQ(e.worker->in_rotation, e.in_rotation);
    const bool last_of_run =
        i + 1 == events.size() || events[i + 1].kind != PollerEventKind::kAudit;
    if (e.audit && last_of_run) {
      EXPECT_EQ(e.worker->phase, e.audit->to);
    }
  }
}

TEST(PollerTest, PlainUnavailableNeedsTheThreshold) {
  TestServer server(Mode::kHealthy);
  TestServer other(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 1);
  poller.add_worker({"remote", server.url(), false});
  // A second worker: the mass-ejection guard never ejects the last one in
  // rotation for non-definitive failures.
  poller.add_worker({"other", other.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("remote", ProbeStatus::kHealthy)));
  server.set_mode(Mode::kUnavailable);
  ASSERT_TRUE(log.wait_until(has_audit("remote", AuditAction::kHealthFailed)));
  // Ejected on the first 503, failed on the second; never restarted.
  int ejected_at = -1;
  int failed_at = -1;
  int unavailable_probes = 0;
  for (std::size_t i = 0; i < log.events().size(); ++i) {
    const PollerEvent& e = log.events()[i];
    if (e.worker_id != "remote") continue;
    if (e.kind == PollerEventKind::kProbe &&
        e.probe->status == ProbeStatus::kHttpStatus) {
      ++unavailable_probes;
      EXPECT_EQ(e.probe->http_status, 503);
      EXPECT_NE(e.probe->detail.find("dispatcher down"), std::string::npos);
    }
    if (e.kind == PollerEventKind::kAudit &&
        e.audit->action == AuditAction::kEjected) {
      ejected_at = unavailable_probes;
    }
    if (e.kind == PollerEventKind::kAudit &&
        e.audit->action == AuditAction::kHealthFailed) {
      failed_at = unavailable_probes;
    }
    EXPECT_NE(e.kind, PollerEventKind::kRestartRequested);
  }
  EXPECT_EQ(ejected_at, 1);
  EXPECT_EQ(failed_at, 2);
  EXPECT_EQ(status_of(poller, "remote").phase, WorkerPhase::kFailed);

  server.set_mode(Mode::kHealthy);
  ASSERT_TRUE(log.wait_until(has_audit("remote", AuditAction::kRecovered)));
  EXPECT_TRUE(status_of(poller, "remote").in_rotation);
}

struct FailureCase {
  const char* name;
  Mode mode;
  ProbeStatus want;
};

class PollerFailureTest : public ::testing::TestWithParam<FailureCase> {};

TEST_P(PollerFailureTest, ProbeFailsWithTheRightStatus) {
  const FailureCase& c = GetParam();
  TestServer server(c.mode);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 3);
  poller.add_worker({"w", server.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return first_probe(events, "w") != nullptr;
  }));
  const ProbeResult* p = first_probe(log.events(), "w");
  EXPECT_EQ(to_string(p->status), std::string(to_string(c.want))) << p->detail;
  EXPECT_FALSE(p->detail.empty());
  poller.stop();  // must not wait for the hung or dripping server
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
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 5);
  poller.add_worker({"gone", refused_url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("gone", ProbeStatus::kConnectError)));
}

TEST(PollerTest, EmptyUrlIsNotProbedUntilSet) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 9);
  poller.add_worker({"later", "", true});
  poller.add_worker({"marker", server.url(), false});
  poller.start();
  EventLog log(poller);
  // Wait for a few probes of another worker; "later" must have none.
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const PollerEvent& e) {
                           return e.kind == PollerEventKind::kProbe &&
                                  e.worker_id == "marker";
                         }) >= 2;
  }));
  EXPECT_EQ(first_probe(log.events(), "later"), nullptr);
  EXPECT_EQ(status_of(poller, "later").probes, 0u);
  poller.set_url("later", server.url());
  ASSERT_TRUE(log.wait_until(has_probe("later", ProbeStatus::kHealthy)));
  EXPECT_TRUE(status_of(poller, "later").in_rotation);
}

TEST(PollerTest, ReportsDriveThePolicy) {
  TestServer server(Mode::kHealthy);
  TestServer other(Mode::kHealthy);
  HealthConfig c = test_config();
  c.backoff_base_s = 0.1;
  c.max_attempts = 1;
  Poller poller(c, mineru_expect(), SteadyClock::now, 11);
  poller.add_worker({"local-1", server.url(), true});
  poller.add_worker({"other", other.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("local-1", ProbeStatus::kHealthy)));
  ASSERT_TRUE(status_of(poller, "local-1").in_rotation);

  // The process died: its port answers 503 (never healthy) until further
  // notice, so no probe can end the restart before the owner reports on it.
  server.set_mode(Mode::kUnavailable);
  poller.report_process_exit("local-1", "exit code -9", -9);
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kEjected)));
  EXPECT_FALSE(status_of(poller, "local-1").in_rotation);
  EXPECT_EQ(status_of(poller, "local-1").last_exit_code, -9);
  EXPECT_EQ(status_of(poller, "local-1").last_cause, kCauseProcessExit);
  ASSERT_TRUE(log.wait_until(has_restart_request("local-1")));
  poller.report_restart_failed("local-1", "spawn: no such file");
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kGaveUp)));
  EXPECT_EQ(status_of(poller, "local-1").phase, WorkerPhase::kGaveUp);
  EXPECT_EQ(status_of(poller, "local-1").last_cause, kCauseRestartFailed);
  // Still probed while given up: a healthy answer brings it back.
  server.set_mode(Mode::kHealthy);
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kRecovered)));
  EXPECT_TRUE(status_of(poller, "local-1").in_rotation);

  poller.report_passive_failure("local-1", "EngineDeadError in task");
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const PollerEvent& e) {
                           return e.kind == PollerEventKind::kAudit &&
                                  e.worker_id == "local-1" &&
                                  e.audit->action == AuditAction::kEjected;
                         }) >= 2;
  }));
  EXPECT_EQ(status_of(poller, "local-1").last_cause, kCausePassiveFailure);
  // Unknown ids are ignored.
  poller.report_process_exit("nobody", "x");
}

TEST(PollerTest, RemovedWorkerStopsProducingEvents) {
  TestServer hung(Mode::kHang);
  TestServer healthy(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 13);
  poller.add_worker({"hung", hung.url(), false});
  poller.add_worker({"ok", healthy.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("ok", ProbeStatus::kHealthy)));
  poller.remove_worker("hung");
  const std::size_t seen = log.events().size();
  ASSERT_TRUE(log.wait_until([seen](const std::vector<PollerEvent>& events) {
    return std::count_if(
               events.begin() + static_cast<std::ptrdiff_t>(seen), events.end(),
               [](const PollerEvent& e) { return e.worker_id == "ok"; }) >= 3;
  }));
  for (std::size_t i = seen; i < log.events().size(); ++i) {
    EXPECT_NE(log.events()[i].worker_id, "hung");
  }
  std::vector<WorkerStatus> all = poller.statuses();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].id, "ok");
}

TEST(PollerTest, ReplacingAWorkerStartsItsPolicyAfresh) {
  TestServer dead(Mode::kUnavailable);
  TestServer healthy(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 17);
  poller.add_worker({"w", dead.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_audit("w", AuditAction::kHealthFailed)));
  poller.add_worker({"w", healthy.url(), false});
  EXPECT_EQ(status_of(poller, "w").phase, WorkerPhase::kStarting);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return !events.empty() && events.back().kind == PollerEventKind::kProbe &&
           events.back().probe->healthy();
  }));
  EXPECT_TRUE(status_of(poller, "w").in_rotation);
}

TEST(PollerTest, StopAndStartAgain) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 19);
  poller.add_worker({"w", server.url(), false});
  poller.start();
  poller.start();  // no second thread
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("w", ProbeStatus::kHealthy)));
  poller.stop();
  const std::uint64_t before = status_of(poller, "w").probes;
  poller.start();
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return status_of(poller, "w").probes > before;
  }));
}

TEST(PollerTest, NotifyFdIsReadableOnlyWithEvents) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 23);
  pollfd p{poller.notify_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  poller.add_worker({"w", server.url(), false});
  poller.start();
  p.revents = 0;
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  EXPECT_FALSE(poller.drain_events().empty());
  poller.stop();
  p.revents = 0;
  // Whatever arrived between the drain and stop() is drained here; after that
  // the fd must be quiet.
  poller.drain_events();
  EXPECT_EQ(poll(&p, 1, 0), 0);
}

TEST(PollerTest, ConcurrencyCapStillProbesEveryone) {
  TestServer hung(Mode::kHang);
  TestServer healthy(Mode::kHealthy);
  HealthConfig c = test_config();
  c.concurrency = 1;
  Poller poller(c, mineru_expect(), SteadyClock::now, 29);
  for (int i = 0; i < 3; ++i)
    poller.add_worker({"hung" + std::to_string(i), hung.url(), false});
  poller.add_worker({"ok", healthy.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("ok", ProbeStatus::kHealthy)));
}

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
  for (int i = 0; i < 40; ++i)
    targets.push_back({"w" + std::to_string(i), healthy.url(), false});
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

TEST(PollerEndpointTest, ExplicitHealthUrlIsProbedWithItsFigures) {
  TestServer main_port(Mode::kHang);  // never asked
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 31);
  poller.add_worker(
      {"local-0", main_port.url(), true, native.url() + "/health"});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("local-0", ProbeStatus::kHealthy)));
  const ProbeResult* p = first_probe(log.events(), "local-0");
  EXPECT_EQ(p->endpoint, ProbeEndpoint::kNative);
  EXPECT_EQ(p->url, native.url() + "/health");
  EXPECT_EQ(p->loop_lag_s, 3.5);
  EXPECT_EQ(p->engine_calls_in_flight, 2);
  EXPECT_EQ(p->seconds_since_progress, 0.25);
  WorkerStatus s = status_of(poller, "local-0");
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
  c.failure_threshold = 10;  // only a definitive answer can fail it this fast
  Poller poller(c, mineru_expect(), SteadyClock::now, 37);
  poller.add_worker({"local-0", "", true, native.url() + "/health"});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_restart_request("local-0")));
  const ProbeResult* p = first_probe(log.events(), "local-0");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->status, ProbeStatus::kLoopHung);
  EXPECT_EQ(p->loop_lag_s, 90.0);
  EXPECT_EQ(status_of(poller, "local-0").last_cause, "loop_hung");
}

TEST(PollerEndpointTest, AdvertisedPortIsDiscoveredThenFallsBackToMain) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  main_port.set_custom(200, advertising_body(native.port()));
  TestServer other(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 41);
  poller.add_worker({"remote", main_port.url(), false});
  poller.add_worker({"other", other.url(), false});
  poller.start();
  EventLog log(poller);
  auto probes_of = [](const std::string& id, ProbeEndpoint endpoint) {
    return [id, endpoint](const std::vector<PollerEvent>& events) {
      return std::count_if(
          events.begin(), events.end(), [&](const PollerEvent& e) {
            return e.kind == PollerEventKind::kProbe && e.worker_id == id &&
                   e.probe->endpoint == endpoint;
          });
    };
  };
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>& events) {
    return probes_of("remote", ProbeEndpoint::kNative)(events) >= 2;
  }));
  const std::string native_url =
      "http://127.0.0.1:" + std::to_string(native.port()) + "/health";
  WorkerStatus s = status_of(poller, "remote");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kNative);
  EXPECT_EQ(s.probe_url, native_url);
  EXPECT_EQ(s.health_url, "");
  EXPECT_TRUE(s.in_rotation);
  // The first probe went to the main port, which advertised the port.
  const ProbeResult* first = first_probe(log.events(), "remote");
  EXPECT_EQ(first->endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(first->native_health_port, native.port());

  // The native endpoint stops answering: after failure_threshold misses
  // the worker is probed on its main port again, which rediscovers it.
  const int main_before = main_port.requests();
  native.set_mode(Mode::kHang);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return main_port.requests() > main_before;
  }));
  const std::size_t misses = static_cast<std::size_t>(std::count_if(
      log.events().begin(), log.events().end(), [](const PollerEvent& e) {
        return e.kind == PollerEventKind::kProbe && e.worker_id == "remote" &&
               e.probe->status == ProbeStatus::kTimeout;
      }));
  EXPECT_EQ(misses, 2u);  // failure_threshold
}

TEST(PollerEndpointTest, AnAnswerThatIsNotHealthyKeepsTheNativeEndpoint) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  main_port.set_custom(200, advertising_body(native.port()));
  TestServer other(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 43);
  poller.add_worker({"remote", main_port.url(), false});
  poller.add_worker({"other", other.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return status_of(poller, "remote").endpoint == ProbeEndpoint::kNative;
  }));
  const int main_before = main_port.requests();
  native.set_custom(503, R"({"status":"starting","endpoint":"native"})");
  ASSERT_TRUE(log.wait_until(has_audit("remote", AuditAction::kHealthFailed)));
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(
               events.begin(), events.end(), [](const PollerEvent& e) {
                 return e.kind == PollerEventKind::kProbe &&
                        e.worker_id == "remote" && !e.probe->healthy();
               }) >= 4;
  }));
  EXPECT_EQ(main_port.requests(), main_before);
  EXPECT_EQ(status_of(poller, "remote").endpoint, ProbeEndpoint::kNative);
}

TEST(PollerEndpointTest, SlowMainPortGetsItsOwnTimeoutAndOneProbeInFlight) {
  TestServer slow(Mode::kSlowHealthy);  // 500 ms, interval 400 ms
  HealthConfig c = test_config();
  c.main_port_timeout_s = 5;  // above interval_s: allowed
  Poller poller(c, mineru_expect(), SteadyClock::now, 47);
  poller.add_worker({"busy", slow.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const PollerEvent& e) {
                           return e.kind == PollerEventKind::kProbe;
                         }) >= 3;
  }));
  for (const PollerEvent& e : log.events()) {
    if (e.kind != PollerEventKind::kProbe) continue;
    EXPECT_TRUE(e.probe->healthy()) << e.probe->detail;
    EXPECT_EQ(e.probe->endpoint, ProbeEndpoint::kMain);
  }
  EXPECT_EQ(slow.max_concurrent(), 1);
  EXPECT_TRUE(status_of(poller, "busy").in_rotation);
}

TEST(PollerEndpointTest, SetUrlReplacesBothUrls) {
  TestServer native(Mode::kHealthy);
  native.set_custom(200, native_body(""));
  TestServer main_port(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 53);
  poller.add_worker({"local-0", "", true});
  poller.set_url("local-0", main_port.url(), native.url() + "/health");
  WorkerStatus s = status_of(poller, "local-0");
  EXPECT_EQ(s.probe_url, native.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kNative);
  poller.set_url("local-0", main_port.url());
  s = status_of(poller, "local-0");
  EXPECT_EQ(s.probe_url, main_port.url() + "/health");
  EXPECT_EQ(s.endpoint, ProbeEndpoint::kMain);
  EXPECT_EQ(s.health_url, "");
  poller.set_url("local-0", "");
  EXPECT_EQ(status_of(poller, "local-0").probe_url, "");
}

// --- mass-ejection guard
// -------------------------------------------------------

int count_audits(const std::vector<PollerEvent>& events, AuditAction action) {
  return static_cast<int>(
      std::count_if(events.begin(), events.end(), [&](const PollerEvent& e) {
        return e.kind == PollerEventKind::kAudit && e.audit->action == action;
      }));
}

TEST(PollerGuardTest, HungFleetKeepsHalfInRotation) {
  std::vector<std::unique_ptr<TestServer>> servers;
  HealthConfig c = test_config();
  Poller poller(c, mineru_expect(), SteadyClock::now, 59);
  for (int i = 0; i < 4; ++i) {
    servers.push_back(std::make_unique<TestServer>(Mode::kHealthy));
    poller.add_worker({"w" + std::to_string(i), servers.back()->url(), true});
  }
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return poller.stats().in_rotation == 4;
  }));
  for (auto& server : servers) server->set_mode(Mode::kHang);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return count_audits(events, AuditAction::kEjected) >= 2 &&
           count_audits(events, AuditAction::kEjectionSuppressed) >= 2;
  }));
  // Let more timeouts come in: the guard holds (50 % of 4 = 2 out).
  const std::size_t seen = log.events().size();
  ASSERT_TRUE(log.wait_until([seen](const std::vector<PollerEvent>& events) {
    return events.size() >= seen + 12;
  }));
  EXPECT_EQ(count_audits(log.events(), AuditAction::kEjected), 2);
  const PollerStats stats = poller.stats();
  EXPECT_EQ(stats.in_rotation, 2u);
  EXPECT_EQ(stats.ejections_suppressed, 2u);  // once per failure streak
  int held = 0;
  for (const WorkerStatus& s : poller.statuses()) {
    if (s.in_rotation) {
      EXPECT_TRUE(s.ejection_suppressed);
      EXPECT_GE(s.consecutive_failures, 1);
      ++held;
    }
  }
  EXPECT_EQ(held, 2);
  for (const PollerEvent& e : log.events()) {
    if (e.kind == PollerEventKind::kAudit &&
        e.audit->action == AuditAction::kEjectionSuppressed) {
      EXPECT_NE(e.audit->reason.find("max_ejection_percent=50"),
                std::string::npos)
          << e.audit->reason;
      EXPECT_EQ(e.audit->cause, "timeout");
    }
  }
}

TEST(PollerGuardTest, DefinitiveFailuresAreNeverHeldBack) {
  std::vector<std::unique_ptr<TestServer>> servers;
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 61);
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<TestServer>(Mode::kHealthy));
    poller.add_worker({"w" + std::to_string(i), servers.back()->url(), true});
  }
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return poller.stats().in_rotation == 2;
  }));
  for (auto& server : servers) server->set_mode(Mode::kEngineDead);
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return count_audits(events, AuditAction::kEjected) >= 2;
  }));
  EXPECT_EQ(count_audits(log.events(), AuditAction::kEjectionSuppressed), 0);
  EXPECT_EQ(poller.stats().in_rotation, 0u);
}

TEST(PollerGuardTest, PassiveFailureOfTheLastWorkerIsHeldBack) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 67);
  poller.add_worker({"only", server.url(), true});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("only", ProbeStatus::kHealthy)));
  poller.report_passive_failure("only", "task failed: EngineDeadError?");
  ASSERT_TRUE(
      log.wait_until(has_audit("only", AuditAction::kEjectionSuppressed)));
  EXPECT_TRUE(status_of(poller, "only").in_rotation);
  // A process exit is definitive: not held back.
  poller.report_process_exit("only", "exit code 1", 1);
  ASSERT_TRUE(log.wait_until(has_audit("only", AuditAction::kEjected)));
  EXPECT_FALSE(status_of(poller, "only").in_rotation);
}

// --- the poller's own I/O
// --------------------------------------------------------

TEST(PollerIoTest, PersistentLoopErrorIsReportedAndDoesNotSpin) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 71);
  poller.add_worker({"w", server.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("w", ProbeStatus::kHealthy)));
  std::atomic<int> calls{0};
  internal::PollerTestPeer::inject_io_fault(poller, [&calls]() {
    ++calls;
    return std::string("epoll_wait: Bad file descriptor");
  });
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::any_of(events.begin(), events.end(), [](const PollerEvent& e) {
      return e.kind == PollerEventKind::kError;
    });
  }));
  const std::size_t probes_seen = static_cast<std::size_t>(std::count_if(
      log.events().begin(), log.events().end(),
      [](const PollerEvent& e) { return e.kind == PollerEventKind::kProbe; }));
  // Half a second of a persistent failure: a busy loop would call the
  // fault hook thousands of times; the backoff (100, 200, 400 ms...) a few.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LE(calls.load(), 5);
  PollerStats stats = poller.stats();
  EXPECT_TRUE(stats.io_failing);
  EXPECT_GE(stats.io_errors, 1u);
  EXPECT_EQ(stats.last_io_error, "epoll_wait: Bad file descriptor");
  const PollerEvent& error = *std::find_if(
      log.events().begin(), log.events().end(),
      [](const PollerEvent& e) { return e.kind == PollerEventKind::kError; });
  EXPECT_EQ(error.error, "epoll_wait: Bad file descriptor");
  EXPECT_EQ(error.worker_id, "");
  EXPECT_FALSE(error.worker.has_value());
  // Not the worker's fault: still in rotation, no failure counted.
  EXPECT_TRUE(status_of(poller, "w").in_rotation);
  EXPECT_EQ(status_of(poller, "w").consecutive_failures, 0);

  internal::PollerTestPeer::inject_io_fault(poller, nullptr);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>& events) {
    return static_cast<std::size_t>(std::count_if(
               events.begin(), events.end(), [](const PollerEvent& e) {
                 return e.kind == PollerEventKind::kProbe;
               })) >= probes_seen + 2;
  }));
  stats = poller.stats();
  EXPECT_FALSE(stats.io_failing);
  EXPECT_EQ(stats.consecutive_io_errors, 0u);
  EXPECT_GE(stats.driver_rebuilds, 1u);
  poller.stop();  // ends a retry wait at once too
}

TEST(PollerIoTest, StatsCountProbesAndCap) {
  TestServer server(Mode::kHealthy);
  HealthConfig c = test_config();
  c.concurrency = 3;
  Poller poller(c, mineru_expect(), SteadyClock::now, 73);
  for (int i = 0; i < 5; ++i)
    poller.add_worker({"w" + std::to_string(i), server.url(), false});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until([&](const std::vector<PollerEvent>&) {
    return poller.stats().probes_finished >= 10;
  }));
  PollerStats stats = poller.stats();
  EXPECT_EQ(stats.workers, 5u);
  EXPECT_EQ(stats.concurrency_cap, 3u);
  EXPECT_GE(stats.probes_started, stats.probes_finished);
  EXPECT_GT(stats.loop_iterations, 0u);
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_FALSE(stats.io_failing);
}

TEST(FdLimitTest, PollerNeverChangesTheLimitAndRaiseDoes) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  {
    TestServer server(Mode::kHealthy);
    HealthConfig c = test_config();
    Poller poller(c, mineru_expect(), SteadyClock::now, 79);
    for (int i = 0; i < 50; ++i)
      poller.add_worker({"w" + std::to_string(i), server.url(), false});
    poller.start();
    EventLog log(poller);
    ASSERT_TRUE(log.wait_until(has_probe("w0", ProbeStatus::kHealthy)));
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
