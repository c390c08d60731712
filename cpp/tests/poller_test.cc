// Poller against real loopback servers. The servers are plain POSIX sockets
// in test threads; every wait is bounded and only waits for events (no
// assertion is about how long something took).
#include "mineru_health/poller.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mineru_health {
namespace {

using Clock = std::chrono::steady_clock;

const char* kHealthyBody =
    R"({"status":"healthy","version":"3.4.4","protocol_version":2,"queued_tasks":0,)"
    R"("processing_tasks":0,"completed_tasks":0,"failed_tasks":0,)"
    R"("max_concurrent_requests":2,"processing_window_size":1})";

enum class Mode {
  kHealthy,
  kUnavailable,   // 503, ordinary
  kEngineDead,    // 503 with engine_dead: true
  kHang,          // accept, never answer
  kCloseMidBody,  // promise 100 bytes, send 10, close
  kSlowDrip,      // one byte of body every 100 ms
  kHugeBody,      // 1 MiB body
  kRedirect,      // 302 to a healthy-looking place: must not be followed
};

std::string http_response(int code, const std::string& reason,
                          const std::string& body,
                          const std::string& extra_headers = "") {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" + body;
}

// A loopback HTTP/1.1 server on 127.0.0.1:<ephemeral> whose behaviour can be
// switched while it runs. Keeps connections alive like uvicorn does.
class TestServer {
 public:
  explicit TestServer(Mode mode) : mode_(mode) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
            0 ||
        listen(listen_fd_, 64) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    socklen_t len = sizeof addr;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~TestServer() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : handlers_) t.join();
    close(listen_fd_);
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }
  void set_mode(Mode mode) { mode_ = mode; }
  int connections() const { return connections_; }
  int requests() const { return requests_; }

 private:
  // Waits until `fd` is readable or the server stops (polls in 20 ms slices).
  bool wait_readable(int fd) {
    for (;;) {
      if (stop_) return false;
      pollfd p{fd, POLLIN, 0};
      int n = poll(&p, 1, 20);
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
  }

  void accept_loop() {
    while (wait_readable(listen_fd_)) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      handlers_.emplace_back([this, fd] {
        serve(fd);
        close(fd);
      });
    }
  }

  bool send_all(int fd, const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n =
          send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  void serve(int fd) {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      // Read one request head.
      while (buffer.find("\r\n\r\n") == std::string::npos) {
        if (!wait_readable(fd)) return;
        ssize_t n = recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) return;
        buffer.append(chunk, static_cast<std::size_t>(n));
      }
      buffer.erase(0, buffer.find("\r\n\r\n") + 4);
      ++requests_;
      switch (mode_.load()) {
        case Mode::kHealthy:
          if (!send_all(fd, http_response(200, "OK", kHealthyBody))) return;
          break;
        case Mode::kUnavailable:
          if (!send_all(
                  fd,
                  http_response(
                      503, "Service Unavailable",
                      R"({"status":"unhealthy","error":"dispatcher down"})")))
            return;
          break;
        case Mode::kEngineDead:
          if (!send_all(
                  fd,
                  http_response(
                      503, "Service Unavailable",
                      R"({"status":"unhealthy","error":"EngineDeadError: engine core died",)"
                      R"("rule":"vllm-engine-dead","category":"engine_dead","engine_dead":true})")))
            return;
          break;
        case Mode::kHang:
          while (wait_readable(fd)) {
            if (recv(fd, chunk, sizeof chunk, 0) <= 0) return;
          }
          return;
        case Mode::kCloseMidBody:
          send_all(fd,
                   "HTTP/1.1 200 OK\r\nContent-Type: "
                   "application/json\r\nContent-Length: 100\r\n\r\n"
                   "{\"status\":");
          return;
        case Mode::kSlowDrip: {
          if (!send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"))
            return;
          for (int i = 0; i < 1000 && !stop_; ++i) {
            if (!send_all(fd, " ")) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          return;
        }
        case Mode::kHugeBody:
          send_all(fd, http_response(200, "OK", std::string(1 << 20, ' ')));
          return;
        case Mode::kRedirect:
          if (!send_all(fd, http_response(302, "Found", "",
                                          "Location: /elsewhere\r\n")))
            return;
          break;
      }
    }
  }

  std::atomic<Mode> mode_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::thread> handlers_;
};

// A port nothing listens on: bind, read the port, close.
std::string refused_url() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

HealthConfig test_config() {
  HealthConfig c;
  c.interval_s = 0.4;
  c.probe_timeout_s = 0.3;
  c.connect_timeout_s = 0.2;
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

  // The owner restarts the process and tells the poller where it listens.
  poller.set_url("local-0", replacement.url());
  ASSERT_TRUE(
      log.wait_until(has_audit("local-0", AuditAction::kRestartSucceeded)));
  WorkerStatus s = status_of(poller, "local-0");
  EXPECT_EQ(s.phase, WorkerPhase::kHealthy);
  EXPECT_TRUE(s.in_rotation);
  EXPECT_EQ(s.url, replacement.url());
  EXPECT_EQ(s.attempt, 0);
}

TEST(PollerTest, PlainUnavailableNeedsTheThreshold) {
  TestServer server(Mode::kHealthy);
  Poller poller(test_config(), mineru_expect(), SteadyClock::now, 1);
  poller.add_worker({"remote", server.url(), false});
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
  HealthConfig c = test_config();
  c.backoff_base_s = 0.1;
  c.max_attempts = 1;
  Poller poller(c, mineru_expect(), SteadyClock::now, 11);
  poller.add_worker({"local-1", server.url(), true});
  poller.start();
  EventLog log(poller);
  ASSERT_TRUE(log.wait_until(has_probe("local-1", ProbeStatus::kHealthy)));
  ASSERT_TRUE(status_of(poller, "local-1").in_rotation);

  // The process died: its port answers 503 (never healthy) until further
  // notice, so no probe can end the restart before the owner reports on it.
  server.set_mode(Mode::kUnavailable);
  poller.report_process_exit("local-1", "exit code -9");
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kEjected)));
  EXPECT_FALSE(status_of(poller, "local-1").in_rotation);
  ASSERT_TRUE(log.wait_until(has_restart_request("local-1")));
  poller.report_restart_failed("local-1", "spawn: no such file");
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kGaveUp)));
  EXPECT_EQ(status_of(poller, "local-1").phase, WorkerPhase::kGaveUp);
  // Still probed while given up: a healthy answer brings it back.
  server.set_mode(Mode::kHealthy);
  ASSERT_TRUE(log.wait_until(has_audit("local-1", AuditAction::kRecovered)));
  EXPECT_TRUE(status_of(poller, "local-1").in_rotation);

  poller.report_passive_failure("local-1", "EngineDeadError in task");
  ASSERT_TRUE(log.wait_until([](const std::vector<PollerEvent>& events) {
    return std::count_if(events.begin(), events.end(),
                         [](const PollerEvent& e) {
                           return e.kind == PollerEventKind::kAudit &&
                                  e.audit->action == AuditAction::kEjected;
                         }) >= 2;
  }));
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

TEST(PollerEventKindTest, Names) {
  EXPECT_STREQ(to_string(PollerEventKind::kProbe), "probe");
  EXPECT_STREQ(to_string(PollerEventKind::kAudit), "audit");
  EXPECT_STREQ(to_string(PollerEventKind::kRestartRequested),
               "restart_requested");
}

}  // namespace
}  // namespace mineru_health
