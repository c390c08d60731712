// HealthServer: libmicrohttpd with its own polling thread (epoll on Linux),
// bounded connections (ConnectionGuard, run on that thread as each
// connection is accepted), an idle timeout and a small per-connection memory
// budget. The handler answers from WorkerState::snapshot() alone: no GIL, no
// event loop, no allocation beyond the JSON body.
#include "mineru_health/health_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "connection_guard.h"

namespace mineru_health {

namespace {

// Ordered, so bodies list MinerU's fields first, as MinerU does.
using json = nlohmann::ordered_json;

json optional_number(const std::optional<double>& value) {
  if (!value) return nullptr;
  // Rounded to the millisecond: more digits would only be noise.
  return std::round(*value * 1000.0) / 1000.0;
}

// MinerU's own /health fields, from what the worker reported.
void add_mineru_fields(json& body, const WorkerSnapshot& snap) {
  if (snap.service) {
    const ServiceInfo& s = *snap.service;
    body["version"] = s.version;
    body["protocol_version"] = s.protocol_version;
  }
  body["queued_tasks"] = snap.tasks.queued;
  body["processing_tasks"] = snap.tasks.processing;
  body["completed_tasks"] = snap.tasks.completed;
  body["failed_tasks"] = snap.tasks.failed;
  if (snap.service) {
    const ServiceInfo& s = *snap.service;
    body["max_concurrent_requests"] = s.max_concurrent_requests;
    body["processing_window_size"] = s.processing_window_size;
    body["task_retention_seconds"] = s.task_retention_seconds;
    body["task_cleanup_interval_seconds"] = s.task_cleanup_interval_seconds;
  }
}

void add_our_fields(json& body, const WorkerSnapshot& snap) {
  body["loop_lag_s"] = optional_number(snap.loop_lag_s);
  body["loop_hung"] = snap.loop_hung;
  body["loop_hang_s"] = snap.loop_hang_s;
  body["engine_calls_in_flight"] = snap.engine_calls_in_flight;
  body["seconds_since_progress"] = optional_number(snap.seconds_since_progress);
  body["stall_s"] = snap.stall_s;
  body["engine_dead"] = !snap.healthy;
  body["fatal_errors"] = snap.fatal_count;
  body["task_local_failures"] = snap.task_local_count;
  body["ambiguous_errors"] = snap.ambiguous_count;
}

void add_fatal_fields(json& body, const FatalRecord& fatal,
                      bool expose_errors) {
  body["rule"] = fatal.rule;
  body["category"] = fatal.category;
  body["exception_type"] = fatal.exception_type;
  body["since"] = fatal.since();
  if (expose_errors) {
    body["error"] = fatal.error;
  } else {
    body["error"] = fmt::format(
        "inference engine unusable ({}); the worker log has the details",
        fatal.cause());
  }
}

json health_body(const WorkerSnapshot& snap, bool expose_errors) {
  json body = json::object();
  body["status"] =
      snap.phase == HealthPhase::kHealthy ? "healthy" : "unhealthy";
  add_mineru_fields(body, snap);
  add_our_fields(body, snap);
  switch (snap.phase) {
    case HealthPhase::kStarting:
      body["starting"] = true;
      body["error"] = "Task manager is not initialized";
      break;
    case HealthPhase::kHealthy:
      break;
    case HealthPhase::kUnhealthy:
      body["error"] = snap.manager_error;
      break;
    case HealthPhase::kLoopHung:
      body["error"] =
          fmt::format("event loop blocked for {:.1f} s (limit {:g} s)",
                      snap.loop_lag_s.value_or(0.0), snap.loop_hang_s);
      break;
    case HealthPhase::kFatal:
      if (snap.first_fatal) {
        add_fatal_fields(body, *snap.first_fatal, expose_errors);
      }
      break;
  }
  return body;
}

// Should a supervisor restart this process? Starting is not a reason.
bool alive(HealthPhase phase) {
  switch (phase) {
    case HealthPhase::kStarting:
    case HealthPhase::kHealthy:
      return true;
    case HealthPhase::kUnhealthy:
    case HealthPhase::kLoopHung:
    case HealthPhase::kFatal:
      return false;
  }
  return false;
}

}  // namespace

HealthAnswer health_answer(std::string_view path,
                           const WorkerSnapshot& snapshot, bool expose_errors) {
  HealthAnswer answer;
  if (path != "/health" && path != "/livez" && path != "/readyz") {
    answer.status = 404;
    answer.body = R"({"status":"not_found"})";
    return answer;
  }
  json body = health_body(snapshot, expose_errors);
  const bool ready = snapshot.phase == HealthPhase::kHealthy;
  if (path == "/livez") {
    const bool live = alive(snapshot.phase);
    body["status"] = live ? "alive" : "unhealthy";
    answer.status = live ? 200 : 503;
  } else {
    answer.status = ready ? 200 : 503;
  }
  // Invalid UTF-8 in a recorded text must not make the answer fail.
  answer.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return answer;
}

namespace {

struct HandlerContext {
  WorkerState* state = nullptr;
  bool expose_errors = false;
};

// The client address as bytes: connections are counted per address.
std::string client_address(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr) return {};
  const sockaddr* address = info->client_addr;
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return std::string(reinterpret_cast<const char*>(&v4->sin_addr),
                       sizeof(v4->sin_addr));
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    return std::string(reinterpret_cast<const char*>(&v6->sin6_addr),
                       sizeof(v6->sin6_addr));
  }
  return {};
}

// Every connection the daemon holds, and the guard that picks which to close.
// Touched only from libmicrohttpd's one internal thread (its callbacks), so
// no lock: the socket a shutdown() reaches is still open, since the daemon
// closes sockets on that same thread after telling us.
struct Connections {
  explicit Connections(ConnectionGuard::Limits limits) : guard(limits) {}
  ConnectionGuard guard;
  std::unordered_map<ConnectionGuard::Id, int> sockets;
};

void on_connection(void* cls, MHD_Connection* connection,
                   void** /*socket_context*/,
                   enum MHD_ConnectionNotificationCode code) {
  auto* connections = static_cast<Connections*>(cls);
  const auto id = reinterpret_cast<ConnectionGuard::Id>(connection);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    connections->guard.closed(id);
    connections->sockets.erase(id);
    return;
  }
  const MHD_ConnectionInfo* fd =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (fd == nullptr) return;
  connections->sockets[id] = fd->connect_fd;
  for (ConnectionGuard::Id old : connections->guard.opened(
           id, client_address(connection), ConnectionGuard::Clock::now())) {
    // The daemon sees end-of-stream and closes it on its next pass.
    const auto found = connections->sockets.find(old);
    if (found != connections->sockets.end()) {
      ::shutdown(found->second, SHUT_RDWR);
    }
  }
}

}  // namespace

// The handler's context lives beside the daemon handle; the daemon (and its
// thread) is stopped in the destructor body, before the context goes.
struct HealthServer::Daemon {
  explicit Daemon(ConnectionGuard::Limits limits) : connections(limits) {}
  HandlerContext context;
  Connections connections;
  MHD_Daemon* handle = nullptr;
  ~Daemon() {
    if (handle != nullptr) MHD_stop_daemon(handle);
  }
};

namespace {

MHD_Result queue(MHD_Connection* connection, int status,
                 const std::string& body, bool allow_header) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "application/json");
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  // One request per connection: a connection kept alive would be one more
  // that a slow client could hold, and a probe costs one loopback connect.
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
  if (allow_header) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result queued = MHD_queue_response(
      connection, static_cast<unsigned int>(status), response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result handle_request(void* cls, MHD_Connection* connection,
                          const char* url, const char* method,
                          const char* /*version*/, const char* /*upload*/,
                          size_t* upload_size, void** /*request_state*/) {
  const auto* context = static_cast<const HandlerContext*>(cls);
  // A body on a GET is read and dropped; the answer does not depend on it.
  if (upload_size != nullptr) *upload_size = 0;
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return queue(connection, MHD_HTTP_METHOD_NOT_ALLOWED,
                 R"({"status":"method_not_allowed"})", true);
  }
  const HealthAnswer answer =
      health_answer(url, context->state->snapshot(), context->expose_errors);
  return queue(connection, answer.status, answer.body, false);
}

}  // namespace

HealthServer::HealthServer(std::shared_ptr<WorkerState> state,
                           HealthServerOptions options)
    : state_(std::move(state)), options_(std::move(options)) {}

HealthServer::~HealthServer() { stop(); }

void HealthServer::stop() { daemon_.reset(); }

HealthServerStart HealthServer::start(std::shared_ptr<WorkerState> state,
                                      HealthServerOptions options) {
  HealthServerStart result;
  if (state == nullptr) {
    result.error = "no worker state to serve";
    return result;
  }
  sockaddr_in v4{};
  sockaddr_in6 v6{};
  const sockaddr* address = nullptr;
  unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD;
  if (inet_pton(AF_INET, options.bind_address.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(options.port);
    address = reinterpret_cast<const sockaddr*>(&v4);
  } else if (inet_pton(AF_INET6, options.bind_address.c_str(), &v6.sin6_addr) ==
             1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(options.port);
    address = reinterpret_cast<const sockaddr*>(&v6);
    flags |= MHD_USE_IPv6;
  } else {
    result.error = fmt::format(
        "health endpoint bind address '{}' is not an IPv4 or IPv6 literal",
        options.bind_address);
    return result;
  }

  std::unique_ptr<HealthServer> server(
      new HealthServer(std::move(state), std::move(options)));
  const HealthServerOptions& opts = server->options_;
  server->daemon_ = std::make_unique<Daemon>(ConnectionGuard::Limits{
      opts.connection_limit, opts.per_ip_connection_limit,
      std::chrono::milliseconds(opts.connection_deadline_ms),
      std::chrono::milliseconds(opts.connection_grace_ms)});
  Daemon& daemon = *server->daemon_;
  // The daemon's own limit only backs ours up: it refuses outright, so it is
  // set well above the guard's, which closes the oldest instead.
  const unsigned hard_limit = opts.connection_limit * 4 + 16;
  daemon.context.state = server->state_.get();
  daemon.context.expose_errors = server->options_.expose_errors;
  daemon.handle = MHD_start_daemon(
      flags, server->options_.port, nullptr, nullptr, &handle_request,
      &daemon.context, MHD_OPTION_SOCK_ADDR, address,
      MHD_OPTION_CONNECTION_LIMIT, hard_limit, MHD_OPTION_NOTIFY_CONNECTION,
      &on_connection, &daemon.connections, MHD_OPTION_CONNECTION_TIMEOUT,
      opts.idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      opts.connection_memory_bytes, MHD_OPTION_END);
  if (daemon.handle == nullptr) {
    result.error = fmt::format(
        "cannot serve the health endpoint on {}:{} (address in use, or not "
        "an address of this host)",
        server->options_.bind_address, server->options_.port);
    return result;
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(daemon.handle, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : server->options_.port;
  result.server = std::move(server);
  return result;
}

}  // namespace mineru_health
