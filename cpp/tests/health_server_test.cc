// HealthServer tests: the pure answer table first, then a real server on
// loopback queried with libcurl. No test sleeps to wait for logic.
#include "mineru_health/health_server.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mineru_health {
namespace {

using json = nlohmann::json;

ServiceInfo service() { return ServiceInfo{"3.4.4", 2, 3, 64, 86400, 300}; }

FatalRecord engine_dead() {
  return FatalRecord{"EngineDeadError: quoting a user's secret document",
                     "vllm.engine_dead", "engine_dead", 1700000000.25,
                     "vllm.v1.engine.exceptions.EngineDeadError"};
}

WorkerSnapshot snapshot_in(HealthPhase phase) {
  WorkerSnapshot snap;
  snap.phase = phase;
  snap.service = service();
  snap.tasks = {2, 3, 10, 1};
  snap.loop_lag_s = 0.0123456;
  snap.loop_hang_s = 60;
  snap.stall_s = 300;
  snap.engine_calls_in_flight = 2;
  snap.seconds_since_progress = 1.5;
  if (phase == HealthPhase::kStarting) snap.service.reset();
  if (phase == HealthPhase::kUnhealthy) {
    snap.manager_error = "Task dispatcher is not running";
  }
  if (phase == HealthPhase::kLoopHung) {
    snap.loop_lag_s = 75.04;
    snap.loop_hung = true;
  }
  if (phase == HealthPhase::kFatal) {
    snap.healthy = false;
    snap.fatal_count = 1;
    snap.first_fatal = engine_dead();
  }
  return snap;
}

struct AnswerCase {
  HealthPhase phase;
  int health;
  int livez;
  int readyz;
};

TEST(HealthAnswer, StatusCodesPerPhaseAndRoute) {
  const AnswerCase cases[] = {
      {HealthPhase::kStarting, 503, 200, 503},
      {HealthPhase::kHealthy, 200, 200, 200},
      {HealthPhase::kUnhealthy, 503, 503, 503},
      {HealthPhase::kLoopHung, 503, 503, 503},
      {HealthPhase::kFatal, 503, 503, 503},
  };
  for (const AnswerCase& c : cases) {
    SCOPED_TRACE(to_string(c.phase));
    const WorkerSnapshot snap = snapshot_in(c.phase);
    EXPECT_EQ(health_answer("/health", snap, false).status, c.health);
    EXPECT_EQ(health_answer("/livez", snap, false).status, c.livez);
    EXPECT_EQ(health_answer("/readyz", snap, false).status, c.readyz);
    EXPECT_EQ(health_answer("/other", snap, false).status, 404);
  }
}

TEST(HealthAnswer, HealthyBodyIsMineruBodyPlusOurFields) {
  const json body = json::parse(
      health_answer("/health", snapshot_in(HealthPhase::kHealthy), false).body);
  EXPECT_EQ(body["status"], "healthy");
  EXPECT_EQ(body["version"], "3.4.4");
  EXPECT_EQ(body["protocol_version"], 2);
  EXPECT_EQ(body["queued_tasks"], 2);
  EXPECT_EQ(body["processing_tasks"], 3);
  EXPECT_EQ(body["completed_tasks"], 10);
  EXPECT_EQ(body["failed_tasks"], 1);
  EXPECT_EQ(body["max_concurrent_requests"], 3);
  EXPECT_EQ(body["processing_window_size"], 64);
  EXPECT_EQ(body["task_retention_seconds"], 86400);
  EXPECT_EQ(body["task_cleanup_interval_seconds"], 300);
  EXPECT_DOUBLE_EQ(body["loop_lag_s"].get<double>(), 0.012);
  EXPECT_EQ(body["loop_hung"], false);
  EXPECT_EQ(body["engine_calls_in_flight"], 2);
  EXPECT_DOUBLE_EQ(body["seconds_since_progress"].get<double>(), 1.5);
  EXPECT_EQ(body["engine_dead"], false);
  EXPECT_FALSE(body.contains("error"));
}

TEST(HealthAnswer, FatalBodyHidesTheMessageUnlessExposed) {
  const WorkerSnapshot snap = snapshot_in(HealthPhase::kFatal);
  const json hidden = json::parse(health_answer("/health", snap, false).body);
  EXPECT_EQ(hidden["status"], "unhealthy");
  EXPECT_EQ(hidden["engine_dead"], true);
  EXPECT_EQ(hidden["rule"], "vllm.engine_dead");
  EXPECT_EQ(hidden["category"], "engine_dead");
  EXPECT_EQ(hidden["exception_type"],
            "vllm.v1.engine.exceptions.EngineDeadError");
  EXPECT_EQ(hidden["since"], "2023-11-14T22:13:20.250000+00:00");
  EXPECT_EQ(hidden["error"].get<std::string>().find("secret"),
            std::string::npos);
  const json shown = json::parse(health_answer("/health", snap, true).body);
  EXPECT_NE(shown["error"].get<std::string>().find("secret"),
            std::string::npos);
}

TEST(HealthAnswer, HungStartingAndUnhealthyBodies) {
  const json hung = json::parse(
      health_answer("/health", snapshot_in(HealthPhase::kLoopHung), false)
          .body);
  EXPECT_EQ(hung["loop_hung"], true);
  EXPECT_EQ(hung["engine_dead"], false);
  EXPECT_EQ(hung["error"], "event loop blocked for 75.0 s (limit 60 s)");
  const json starting = json::parse(
      health_answer("/health", snapshot_in(HealthPhase::kStarting), false)
          .body);
  EXPECT_EQ(starting["starting"], true);
  EXPECT_FALSE(starting.contains("max_concurrent_requests"));
  const json livez = json::parse(
      health_answer("/livez", snapshot_in(HealthPhase::kStarting), false).body);
  EXPECT_EQ(livez["status"], "alive");
  const json manager = json::parse(
      health_answer("/health", snapshot_in(HealthPhase::kUnhealthy), false)
          .body);
  EXPECT_EQ(manager["error"], "Task dispatcher is not running");
}

TEST(HealthAnswer, InvalidUtf8NeverBreaksTheBody) {
  WorkerSnapshot snap = snapshot_in(HealthPhase::kFatal);
  snap.first_fatal->error = std::string("bad \xff\xfe bytes");
  snap.first_fatal->rule = std::string("rule\xc3");
  const HealthAnswer answer = health_answer("/health", snap, true);
  EXPECT_EQ(answer.status, 503);
  EXPECT_TRUE(json::parse(answer.body).is_object());
}

// --- a real server ---------------------------------------------------------

size_t append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

struct Reply {
  long status = 0;
  std::string body;
  CURLcode code = CURLE_OK;
};

Reply fetch(const std::string& url, const char* method = "GET") {
  Reply reply;
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  reply.code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  curl_easy_cleanup(curl);
  return reply;
}

std::unique_ptr<HealthServer> serve(std::shared_ptr<WorkerState> state,
                                    HealthServerOptions options = {}) {
  HealthServerStart started = HealthServer::start(std::move(state), options);
  EXPECT_TRUE(started.ok()) << started.error;
  return std::move(started.server);
}

std::string url(const HealthServer& server, const char* path) {
  return "http://127.0.0.1:" + std::to_string(server.port()) + path;
}

TEST(HealthServer, ServesEveryRouteFromTheState) {
  auto state = std::make_shared<WorkerState>();
  auto server = serve(state);
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);

  Reply starting = fetch(url(*server, "/health"));
  EXPECT_EQ(starting.code, CURLE_OK);
  EXPECT_EQ(starting.status, 503);
  EXPECT_EQ(fetch(url(*server, "/livez")).status, 200);

  state->set_service(service());
  state->loop_tick();
  Reply healthy = fetch(url(*server, "/health"));
  EXPECT_EQ(healthy.status, 200);
  EXPECT_EQ(json::parse(healthy.body)["status"], "healthy");
  EXPECT_EQ(fetch(url(*server, "/readyz")).status, 200);
  EXPECT_EQ(fetch(url(*server, "/health"), "HEAD").status, 200);

  state->record_fatal(engine_dead());
  Reply dead = fetch(url(*server, "/health"));
  EXPECT_EQ(dead.status, 503);
  EXPECT_EQ(json::parse(dead.body)["engine_dead"], true);
  EXPECT_EQ(fetch(url(*server, "/livez")).status, 503);
  EXPECT_EQ(fetch(url(*server, "/nope")).status, 404);
  EXPECT_EQ(fetch(url(*server, "/health"), "POST").status, 405);
  EXPECT_EQ(fetch(url(*server, "/health?x=1")).status, 503);
}

TEST(HealthServer, ServesOnIpv6Loopback) {
  HealthServerOptions options;
  options.bind_address = "::1";
  HealthServerStart started =
      HealthServer::start(std::make_shared<WorkerState>(), options);
  if (!started.ok()) GTEST_SKIP() << "no IPv6 loopback: " << started.error;
  Reply reply = fetch("http://[::1]:" + std::to_string(started.server->port()) +
                      "/livez");
  EXPECT_EQ(reply.status, 200);
}

TEST(HealthServer, BadAddressAndBusyPortAreValues) {
  HealthServerOptions bad;
  bad.bind_address = "localhost";  // a name, not a literal
  HealthServerStart refused =
      HealthServer::start(std::make_shared<WorkerState>(), bad);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("localhost"), std::string::npos);

  auto first = serve(std::make_shared<WorkerState>());
  ASSERT_NE(first, nullptr);
  HealthServerOptions same;
  same.port = first->port();
  HealthServerStart busy =
      HealthServer::start(std::make_shared<WorkerState>(), same);
  EXPECT_FALSE(busy.ok());
  EXPECT_NE(busy.error.find(std::to_string(first->port())), std::string::npos);
  EXPECT_FALSE(HealthServer::start(nullptr, {}).ok());
}

TEST(HealthServer, StopIsIdempotentAndReleasesThePort) {
  auto server = serve(std::make_shared<WorkerState>());
  ASSERT_NE(server, nullptr);
  const std::string target = url(*server, "/livez");
  server->stop();
  server->stop();
  EXPECT_EQ(fetch(target).code, CURLE_COULDNT_CONNECT);
}

int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(HealthServer, SilentConnectionsDoNotBlockProbes) {
  HealthServerOptions options;
  options.connection_limit = 8;
  options.idle_timeout_s = 1;
  auto state = std::make_shared<WorkerState>();
  state->set_service(service());
  auto server = serve(state, options);
  ASSERT_NE(server, nullptr);
  // Half the connection budget held open by clients that never speak.
  int silent[4];
  for (int& fd : silent) fd = connect_to(server->port());
  // A probe still gets through at once, and the silent ones are closed
  // after the idle timeout (read returns 0: the server hung up).
  EXPECT_EQ(fetch(url(*server, "/health")).status, 200);
  for (int fd : silent) {
    ASSERT_GE(fd, 0);
    timeval bound{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
    char byte;
    EXPECT_EQ(::read(fd, &byte, 1), 0);
    ::close(fd);
  }
}

// Issue 17: 64 sockets trickling a byte now and then used to fill every
// slot. Now the oldest give way to the newest, from the same address too, and
// every answer closes its connection.
TEST(HealthServer, SlowClientsFromTheProbesAddressNeverCrowdItOut) {
  HealthServerOptions options;
  options.connection_limit = 8;
  options.per_ip_connection_limit = 4;
  options.connection_grace_ms = 0;  // the grace has its own unit test
  auto state = std::make_shared<WorkerState>();
  state->set_service(service());
  state->loop_tick();
  auto server = serve(state, options);
  ASSERT_NE(server, nullptr);
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = connect_to(server->port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, "G", 1, MSG_NOSIGNAL),
              1);  // a request that never ends
    slow.push_back(fd);
  }
  for (int round = 0; round < 5; ++round) {
    Reply probe = fetch(url(*server, "/health"));
    EXPECT_EQ(probe.code, CURLE_OK);
    EXPECT_EQ(probe.status, 200);
    for (int fd : slow) (void)::send(fd, "E", 1, MSG_NOSIGNAL);  // trickle
  }
  // All but the newest few slow ones were closed by the server.
  int closed = 0;
  for (int fd : slow) {
    timeval bound{0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
    char byte;
    if (::read(fd, &byte, 1) == 0) ++closed;
    ::close(fd);
  }
  EXPECT_GE(closed, 64 - 4);
}

TEST(HealthServer, OversizedRequestHeadIsRefusedNotFatal) {
  HealthServerOptions options;
  options.connection_memory_bytes = 4096;
  auto state = std::make_shared<WorkerState>();
  state->set_service(service());
  auto server = serve(state, options);
  ASSERT_NE(server, nullptr);
  CURL* curl = curl_easy_init();
  std::string body;
  const std::string huge(64 * 1024, 'x');
  curl_slist* headers = curl_slist_append(nullptr, ("X-Big: " + huge).c_str());
  const std::string target = url(*server, "/health");
  curl_easy_setopt(curl, CURLOPT_URL, target.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  EXPECT_NE(status, 200);
  // The server keeps serving.
  EXPECT_EQ(fetch(target).status, 200);
}

}  // namespace
}  // namespace mineru_health
