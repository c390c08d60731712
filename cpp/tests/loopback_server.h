// A loopback HTTP/1.1 server for poller and transfer tests: plain POSIX
// sockets in test threads, on 127.0.0.1:<ephemeral>, whose behaviour can be
// switched while it runs. Every wait is bounded by the server's stop flag.
#ifndef MINERU_HEALTH_TESTS_LOOPBACK_SERVER_H_
#define MINERU_HEALTH_TESTS_LOOPBACK_SERVER_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace mineru_health::test_support {

inline const char* kHealthyBody =
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
  kSlowHealthy,   // healthy after 500 ms, like a busy MinerU main port
  kCustom,        // set_custom()'s status and body
};

inline std::string http_response(int code, const std::string& reason,
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
  void set_custom(int code, std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    custom_code_ = code;
    custom_body_ = std::move(body);
    mode_ = Mode::kCustom;
  }
  int port() const { return port_; }
  int connections() const { return connections_; }
  int requests() const { return requests_; }
  int max_concurrent() const { return max_concurrent_; }

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
      const int concurrent = ++concurrent_;
      int seen = max_concurrent_.load();
      while (concurrent > seen &&
             !max_concurrent_.compare_exchange_weak(seen, concurrent)) {
      }
      const bool kept = answer(fd, chunk, sizeof chunk);
      --concurrent_;
      if (!kept) return;
    }
  }

  // Answers one request; false when the connection is done.
  bool answer(int fd, char* chunk, std::size_t chunk_size) {
    switch (mode_.load()) {
      case Mode::kHealthy:
        if (!send_all(fd, http_response(200, "OK", kHealthyBody))) return false;
        break;
      case Mode::kUnavailable:
        if (!send_all(
                fd, http_response(
                        503, "Service Unavailable",
                        R"({"status":"unhealthy","error":"dispatcher down"})")))
          return false;
        break;
      case Mode::kEngineDead:
        if (!send_all(
                fd,
                http_response(
                    503, "Service Unavailable",
                    R"({"status":"unhealthy","error":"EngineDeadError: engine core died",)"
                    R"("rule":"vllm-engine-dead","category":"engine_dead","engine_dead":true})")))
          return false;
        break;
      case Mode::kHang:
        while (wait_readable(fd)) {
          if (recv(fd, chunk, chunk_size, 0) <= 0) return false;
        }
        return false;
      case Mode::kCloseMidBody:
        send_all(fd,
                 "HTTP/1.1 200 OK\r\nContent-Type: "
                 "application/json\r\nContent-Length: 100\r\n\r\n"
                 "{\"status\":");
        return false;
      case Mode::kSlowDrip: {
        if (!send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"))
          return false;
        for (int i = 0; i < 1000 && !stop_; ++i) {
          if (!send_all(fd, " ")) return false;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
      }
      case Mode::kHugeBody:
        send_all(fd, http_response(200, "OK", std::string(1 << 20, ' ')));
        return false;
      case Mode::kRedirect:
        if (!send_all(fd, http_response(302, "Found", "",
                                        "Location: /elsewhere\r\n")))
          return false;
        break;
      case Mode::kSlowHealthy:
        for (int i = 0; i < 25 && !stop_; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (!send_all(fd, http_response(200, "OK", kHealthyBody))) return false;
        break;
      case Mode::kCustom: {
        std::string response;
        {
          std::lock_guard<std::mutex> lock(mu_);
          response = http_response(custom_code_, "Status", custom_body_);
        }
        if (!send_all(fd, response)) return false;
        break;
      }
    }
    return true;
  }

  std::atomic<Mode> mode_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
  std::atomic<int> concurrent_{0};
  std::atomic<int> max_concurrent_{0};
  int custom_code_ = 200;
  std::string custom_body_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::thread> handlers_;
};

// A port nothing listens on: bind, read the port, close.
inline std::string refused_url() {
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

}  // namespace mineru_health::test_support

#endif  // MINERU_HEALTH_TESTS_LOOPBACK_SERVER_H_
