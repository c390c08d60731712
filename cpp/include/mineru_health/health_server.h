// Native health endpoint: serves GET /health, /livez and /readyz from a
// WorkerState on a libmicrohttpd thread of its own, so a worker whose event
// loop is busy (MinerU blocks it for seconds under load) still answers at
// once, and a hung or stopped process does not.
//
//   auto state = std::make_shared<mineru_health::WorkerState>();
//   mineru_health::HealthServerOptions options;
//   options.port = 9123;
//   auto started = mineru_health::HealthServer::start(state, options);
//   if (!started.ok()) log(started.error);
//   // ... started.server->port(); the server stops when destroyed.
//
// Routes:
//   /health  MinerU's /health body plus our fields; 200 while serving (busy
//            included), 503 while starting, when MinerU's task manager is
//            unhealthy, when the loop is hung ("loop_hung": true) or the
//            engine is dead or stalled ("engine_dead": true).
//   /livez   200 unless the process should be restarted (fatal, loop hung).
//   /readyz  200 only while the worker should receive new tasks.
//
// Thread-safety: HealthServer's methods may be called from any thread; the
// request handler runs on libmicrohttpd's thread and only reads WorkerState.
#ifndef MINERU_HEALTH_HEALTH_SERVER_H_
#define MINERU_HEALTH_HEALTH_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mineru_health/worker_state.h"

namespace mineru_health {

struct HealthServerOptions {
  std::string bind_address = "127.0.0.1";  // an IPv4 or IPv6 literal
  std::uint16_t port = 0;                  // 0: an ephemeral port
  // A probe is one short request, answered and closed at once. No client can
  // crowd it out: past these bounds the OLDEST connections are closed (the
  // newest, a probe that speaks at once, is served), and none lives past the
  // deadline however slowly it trickles bytes (connection_guard.h).
  unsigned connection_limit = 64;          // open connections, in all
  unsigned per_ip_connection_limit = 16;   // per client address; 0: no bound
  unsigned connection_deadline_ms = 2000;  // from acceptance, absolute
  unsigned connection_grace_ms = 250;      // never closed for the bounds
  unsigned idle_timeout_s = 2;             // silent connections closed
  std::size_t connection_memory_bytes = 16 * 1024;  // request head budget
  // Publish the failing exception's message in bodies (it can quote a
  // user's document); off by default: rule, category, type and time only.
  bool expose_errors = false;
};

// One answer, computed without any I/O.
struct HealthAnswer {
  int status = 200;
  std::string body;  // JSON
};

// The answer for `path` ("/health", "/livez", "/readyz"; anything else is
// 404) given a snapshot. Pure; used by the server and by the worker's main
// /health, so both say the same.
HealthAnswer health_answer(std::string_view path,
                           const WorkerSnapshot& snapshot, bool expose_errors);

class HealthServer;

struct HealthServerStart {
  std::unique_ptr<HealthServer> server;  // null on failure
  std::string error;                     // why, naming address and port
  bool ok() const { return server != nullptr; }
};

class HealthServer {
 public:
  // Binds and starts serving. A bad address or a port in use is an expected
  // failure, returned as a value.
  [[nodiscard]] static HealthServerStart start(
      std::shared_ptr<WorkerState> state, HealthServerOptions options);
  ~HealthServer();  // stops serving; returns once the thread has ended
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  std::uint16_t port() const { return port_; }
  const std::string& bind_address() const { return options_.bind_address; }
  void stop();  // idempotent

 private:
  struct Daemon;
  HealthServer(std::shared_ptr<WorkerState> state, HealthServerOptions options);

  std::shared_ptr<WorkerState> state_;
  HealthServerOptions options_;
  std::uint16_t port_ = 0;
  // Declared last: destroyed first, so the daemon thread never outlives the
  // state it reads.
  std::unique_ptr<Daemon> daemon_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_HEALTH_SERVER_H_
