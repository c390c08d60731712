// Benchmark driver for Poller::sweep against many loopback /health endpoints.
//
//   poller_bench                         # 100, 1000, 10000 endpoints x 0%/10%
//   hung poller_bench --sizes 100,1000 --hung 0,10 --timeout 1 poller_bench
//   --serve N HUNG_PCT FILE # serve only; write "url hung" lines to
//                                        # FILE, print READY, exit on stdin EOF
//   poller_bench --sweep FILE [--timeout S] [--concurrency C]
//                                        # one sweep over FILE's URLs, JSON out
//   poller_bench --live SECONDS --sizes 2000,10000 --hung 0,10,50
//                                        # the running Poller (production
//                                        # config) for SECONDS per fleet:
//                                        # CPU per finished probe
//
// Endpoints are served by forked responder processes (so the sweep's CPU
// and RSS figures are the prober's alone), each an epoll loop over a few
// thousand listening sockets spread over 127.0.0.x. A healthy endpoint
// answers MinerU's healthy JSON and keeps the connection open; a hung one
// accepts and never answers. Every figure is printed next to its inputs;
// run.py turns them into ratios against in-run baselines.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mineru_health/config.h"
#include "mineru_health/poller.h"

namespace {

constexpr int kEndpointsPerResponder =
    4000;  // 2 fds each at most: fits 20k rlimits
constexpr int kEndpointsPerAddress = 1000;  // spread listeners over 127.0.0.x

// A body shaped like MinerU 3.4.4's healthy /health answer.
const std::string& healthy_response() {
  static const std::string body =
      R"({"status":"healthy","version":"3.4.4","protocol_version":2,"queued_tasks":0,)"
      R"("processing_tasks":0,"completed_tasks":12,"failed_tasks":0,"max_concurrent_requests":3,)"
      R"("processing_window_size":1,"task_retention_seconds":86400,)"
      R"("task_cleanup_interval_seconds":3600})";
  static const std::string response = fmt::format(
      "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
      "{}\r\n\r\n{}",
      body.size(), body);
  return response;
}

struct Endpoint {
  std::string host;
  int port = 0;
  bool hung = false;
  std::string url() const { return fmt::format("http://{}:{}", host, port); }
};

// Up to the hard limit: responders hold two descriptors per endpoint, the
// prober one per probe in flight.
void raise_fd_limit() {
  const mineru_health::FdLimit lim =
      mineru_health::raise_fd_limit(std::size_t{1} << 20);
  if (!lim.error.empty()) {
    std::fprintf(stderr, "poller_bench: %s\n", lim.error.c_str());
  }
}

// Which endpoints hang: every k-th, so any prefix holds the same share.
bool is_hung(int index, int hung_pct) {
  if (hung_pct <= 0) return false;
  return (index * hung_pct) / 100 != ((index + 1) * hung_pct) / 100;
}

// --- responder process -----------------------------------------------------

struct Conn {
  bool listener = false;
  bool hung = false;
  std::string buffer;
};

[[noreturn]] void responder_main(const std::vector<Endpoint>& endpoints,
                                 int first, int count, int report_fd,
                                 int control_fd) {
  raise_fd_limit();
  signal(SIGPIPE, SIG_IGN);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  // Indexed by fd and sized once (fds stay below the limit), so references
  // into it stay valid.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  std::vector<Conn> conns(std::min<std::size_t>(lim.rlim_cur, 1 << 20));
  auto slot = [&](int fd) -> Conn& {
    return conns[static_cast<std::size_t>(fd)];
  };
  std::vector<int> ports;
  for (int i = first; i < first + count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, endpoints[static_cast<std::size_t>(i)].host.c_str(),
              &addr.sin_addr);
    if (fd < 0 ||
        bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(fd, 64) != 0) {
      std::fprintf(stderr, "responder: cannot listen: %s\n",
                   std::strerror(errno));
      _exit(2);
    }
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ports.push_back(ntohs(addr.sin_port));
    Conn& c = slot(fd);
    c.listener = true;
    c.hung = endpoints[static_cast<std::size_t>(i)].hung;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  const auto bytes = static_cast<ssize_t>(ports.size() * sizeof(int));
  if (write(report_fd, ports.data(), ports.size() * sizeof(int)) != bytes)
    _exit(3);
  close(report_fd);
  epoll_event cev{};
  cev.events = EPOLLIN;
  cev.data.fd = control_fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, control_fd, &cev);

  std::vector<epoll_event> ready(512);
  char chunk[4096];
  for (;;) {
    int n = epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), -1);
    if (n < 0 && errno == EINTR) continue;
    for (int k = 0; k < n; ++k) {
      const int fd = ready[static_cast<std::size_t>(k)].data.fd;
      if (fd == control_fd) _exit(0);  // parent closed the pipe
      Conn& c = slot(fd);
      if (c.listener) {
        for (;;) {
          int cfd = accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cfd < 0) break;
          Conn& cc = slot(cfd);
          cc = Conn{};
          cc.hung = c.hung;
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = cfd;
          epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev);
        }
        continue;
      }
      bool closed = false;
      for (;;) {
        ssize_t got = recv(fd, chunk, sizeof chunk, 0);
        if (got > 0) {
          if (!c.hung) c.buffer.append(chunk, static_cast<std::size_t>(got));
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
          closed = true;
        break;
      }
      // A hung endpoint reads and drops everything, never answering.
      while (!c.hung) {
        auto end = c.buffer.find("\r\n\r\n");
        if (end == std::string::npos) break;
        c.buffer.erase(0, end + 4);
        const std::string& response = healthy_response();
        if (send(fd, response.data(), response.size(), MSG_NOSIGNAL) < 0) {
          closed = true;
          break;
        }
      }
      if (closed) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        c = Conn{};
      }
    }
  }
}

struct Responders {
  std::vector<Endpoint> endpoints;
  std::vector<pid_t> pids;
  std::vector<int> control_fds;

  ~Responders() {
    for (int fd : control_fds) close(fd);
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
};

void start_responders(Responders& r, int n, int hung_pct) {
  r.endpoints.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    Endpoint& e = r.endpoints[static_cast<std::size_t>(i)];
    e.host = fmt::format("127.0.0.{}", 1 + i / kEndpointsPerAddress);
    e.hung = is_hung(i, hung_pct);
  }
  std::fflush(stdout);
  for (int first = 0; first < n; first += kEndpointsPerResponder) {
    const int count = std::min(kEndpointsPerResponder, n - first);
    int report[2];
    int control[2];
    if (pipe2(report, O_CLOEXEC) != 0 || pipe2(control, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe failed");
    }
    pid_t pid = fork();
    if (pid == 0) {
      close(report[0]);
      close(control[1]);
      responder_main(r.endpoints, first, count, report[1], control[0]);
    }
    close(report[1]);
    close(control[0]);
    r.pids.push_back(pid);
    r.control_fds.push_back(control[1]);
    std::vector<int> ports(static_cast<std::size_t>(count));
    std::size_t want = ports.size() * sizeof(int);
    std::size_t got = 0;
    auto* out = reinterpret_cast<char*>(ports.data());
    while (got < want) {
      ssize_t k = read(report[0], out + got, want - got);
      if (k <= 0) throw std::runtime_error("responder failed to start");
      got += static_cast<std::size_t>(k);
    }
    close(report[0]);
    for (int i = 0; i < count; ++i) {
      r.endpoints[static_cast<std::size_t>(first + i)].port =
          ports[static_cast<std::size_t>(i)];
    }
  }
}

// --- the measured sweep ------------------------------------------------------

struct Measurement {
  std::size_t probes = 0;
  std::size_t healthy = 0;
  std::size_t timeouts = 0;
  std::size_t other = 0;
  double wall_s = 0;
  double cpu_s = 0;
  long max_rss_kb = 0;
};

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

Measurement measure_sweep(const std::vector<std::string>& urls,
                          double timeout_s, int concurrency) {
  mineru_health::HealthConfig config;
  config.probe_timeout_s = timeout_s;
  config.connect_timeout_s = std::min(0.5, timeout_s);
  config.interval_s = timeout_s * 2;
  config.concurrency = concurrency;
  mineru_health::ProbeExpectations expect;
  expect.protocol_version = 2;
  std::vector<mineru_health::Target> targets;
  targets.reserve(urls.size());
  for (std::size_t i = 0; i < urls.size(); ++i) {
    targets.push_back({fmt::format("w{}", i), urls[i], true});
  }
  const double cpu0 = cpu_seconds();
  mineru_health::SweepStats stats;
  std::vector<mineru_health::ProbeResult> results =
      mineru_health::Poller::sweep(targets, config, expect, &stats);
  Measurement m;
  m.cpu_s = cpu_seconds() - cpu0;
  m.wall_s = stats.wall_s;
  m.probes = stats.probes;
  m.healthy = stats.healthy;
  for (const auto& r : results) {
    if (r.status == mineru_health::ProbeStatus::kTimeout) {
      ++m.timeouts;
    } else if (!r.healthy()) {
      ++m.other;
    }
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  m.max_rss_kb = u.ru_maxrss;
  return m;
}

std::string to_json(const Measurement& m, std::size_t n, int hung_pct,
                    double timeout_s, int concurrency) {
  const double per_cpu =
      m.cpu_s > 0 ? static_cast<double>(m.probes) / m.cpu_s : 0.0;
  return fmt::format(
      R"({{"impl":"cpp_sweep","endpoints":{},"hung_pct":{},"timeout_s":{},"concurrency":{},)"
      R"("probes":{},"healthy":{},"timeouts":{},"other_failures":{},"wall_s":{:.4f},)"
      R"("cpu_s":{:.4f},"probes_per_cpu_s":{:.0f},"max_rss_kb":{}}})",
      n, hung_pct, timeout_s, concurrency, m.probes, m.healthy, m.timeouts,
      m.other, m.wall_s, m.cpu_s, per_cpu, m.max_rss_kb);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return out;
}

int serve_only(int n, int hung_pct, const std::string& file) {
  raise_fd_limit();
  Responders r;
  start_responders(r, n, hung_pct);
  {
    std::ofstream out(file);
    for (const Endpoint& e : r.endpoints)
      out << e.url() << ' ' << (e.hung ? 1 : 0) << '\n';
  }
  std::cout << "READY " << file << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

int sweep_file(const std::string& file, double timeout_s, int concurrency) {
  raise_fd_limit();
  std::ifstream in(file);
  std::vector<std::string> urls;
  int hung = 0;
  std::string url;
  int flag = 0;
  while (in >> url >> flag) {
    urls.push_back(url);
    hung += flag;
  }
  const int hung_pct =
      urls.empty() ? 0
                   : static_cast<int>(
                         100.0 * hung / static_cast<double>(urls.size()) + 0.5);
  Measurement m = measure_sweep(urls, timeout_s, concurrency);
  std::cout << to_json(m, urls.size(), hung_pct, timeout_s, concurrency)
            << std::endl;
  return 0;
}

// --- the live poller
// ----------------------------------------------------------

// A running Poller over the whole fleet for `window_s` seconds after one
// interval of warm-up: CPU time of this process (the responders are other
// processes), probes finished and how they ended. Remote workers, so hung
// ones stay `failed` and keep being probed (and timing out) all along.
struct LiveMeasurement {
  std::uint64_t loop_iterations = 0;
  double mean_latency_ms = 0;
  std::uint64_t probes = 0;
  std::uint64_t healthy = 0;
  std::uint64_t timeouts = 0;
  std::uint64_t other = 0;
  double window_s = 0;
  double cpu_s = 0;
  long max_rss_kb = 0;
};

LiveMeasurement measure_live(const std::vector<std::string>& urls,
                             double window_s) {
  mineru_health::HealthConfig config;  // production: 2 s / 1.5 s / 0.5 s
  config.concurrency = 10000;
  mineru_health::ProbeExpectations expect;
  expect.protocol_version = 2;
  mineru_health::Poller poller(config, expect);
  for (std::size_t i = 0; i < urls.size(); ++i) {
    // Probed as native endpoints (explicit health_url), so a hung one is
    // judged by the 1.5 s probe timeout, not the main port's generous one.
    poller.add_worker(
        {fmt::format("w{}", i), urls[i], false, urls[i] + "/health"});
  }
  LiveMeasurement m;
  double latency_sum = 0;
  auto drain = [&](bool count) {
    for (const auto& e : poller.drain_events()) {
      if (!count || e.kind != mineru_health::PollerEventKind::kProbe ||
          !e.probe)
        continue;
      ++m.probes;
      latency_sum += e.probe->latency_s;
      if (e.probe->healthy()) {
        ++m.healthy;
      } else if (e.probe->status == mineru_health::ProbeStatus::kTimeout) {
        ++m.timeouts;
      } else {
        ++m.other;
      }
    }
  };
  poller.start();
  // Warm-up: first probes are spread over one interval, connections open.
  const auto warm_until =
      std::chrono::steady_clock::now() +
      std::chrono::duration<double>(config.interval_s + config.probe_timeout_s);
  while (std::chrono::steady_clock::now() < warm_until) {
    drain(false);
    usleep(100 * 1000);
  }
  drain(false);
  const std::uint64_t iterations0 = poller.stats().loop_iterations;
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const auto t_end = t0 + std::chrono::duration<double>(window_s);
  while (std::chrono::steady_clock::now() < t_end) {
    drain(true);
    usleep(100 * 1000);
  }
  drain(true);
  m.cpu_s = cpu_seconds() - cpu0;
  m.loop_iterations = poller.stats().loop_iterations - iterations0;
  m.window_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  poller.stop();
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  m.max_rss_kb = u.ru_maxrss;
  m.mean_latency_ms =
      m.probes > 0 ? latency_sum * 1e3 / static_cast<double>(m.probes) : 0.0;
  return m;
}

std::string live_json(const LiveMeasurement& m, std::size_t n, int hung_pct) {
  const double per_probe_us =
      m.probes > 0 ? m.cpu_s * 1e6 / static_cast<double>(m.probes) : 0.0;
  return fmt::format(
      R"({{"impl":"cpp_live","endpoints":{},"hung_pct":{},"window_s":{:.3f},)"
      R"("probes":{},"healthy":{},"timeouts":{},"other_failures":{},)"
      R"("cpu_s":{:.4f},"core_share":{:.4f},"cpu_per_probe_us":{:.2f},)"
      R"("loop_iterations":{},"mean_latency_ms":{:.2f},"max_rss_kb":{}}})",
      n, hung_pct, m.window_s, m.probes, m.healthy, m.timeouts, m.other,
      m.cpu_s, m.window_s > 0 ? m.cpu_s / m.window_s : 0.0, per_probe_us,
      m.loop_iterations, m.mean_latency_ms, m.max_rss_kb);
}

void run_live(int n, int hung_pct, double window_s) {
  Responders r;
  start_responders(r, n, hung_pct);
  std::vector<std::string> urls;
  for (const Endpoint& e : r.endpoints) urls.push_back(e.url());
  LiveMeasurement m = measure_live(urls, window_s);
  std::cout << live_json(m, urls.size(), hung_pct) << std::endl;
}

void run_scenario(int n, int hung_pct, double timeout_s, int concurrency) {
  Responders r;  // its destructor stops the responder processes
  start_responders(r, n, hung_pct);
  std::vector<std::string> urls;
  for (const Endpoint& e : r.endpoints) urls.push_back(e.url());
  Measurement m = measure_sweep(urls, timeout_s, concurrency);
  std::cout << to_json(m, urls.size(), hung_pct, timeout_s, concurrency)
            << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<int> sizes = {100, 1000, 10000};
  std::vector<int> hung = {0, 10};
  double timeout_s = 1.0;
  int concurrency = 10000;
  double live_window_s = 0;  // > 0: measure the live poller instead
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto next = [&]() -> const std::string& {
        if (i + 1 >= args.size())
          throw std::invalid_argument(a + " needs a value");
        return args[++i];
      };
      if (a == "--serve") {
        const int n = std::stoi(next());
        const int pct = std::stoi(next());
        return serve_only(n, pct, next());
      }
      if (a == "--sweep") {
        const std::string file = next();
        for (std::size_t j = i + 1; j < args.size(); ++j) {
          if (args[j] == "--timeout" && j + 1 < args.size())
            timeout_s = std::stod(args[++j]);
          if (args[j] == "--concurrency" && j + 1 < args.size())
            concurrency = std::stoi(args[++j]);
        }
        return sweep_file(file, timeout_s, concurrency);
      }
      if (a == "--sizes") {
        sizes = parse_list(next());
      } else if (a == "--hung") {
        hung = parse_list(next());
      } else if (a == "--timeout") {
        timeout_s = std::stod(next());
      } else if (a == "--concurrency") {
        concurrency = std::stoi(next());
      } else if (a == "--live") {
        live_window_s = std::stod(next());
      } else {
        std::cerr << "unknown argument " << a << "\n";
        return 2;
      }
    }
    raise_fd_limit();
    // Each scenario in a fresh child, so max RSS belongs to that scenario.
    for (int n : sizes) {
      for (int pct : hung) {
        std::fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
          if (live_window_s > 0) {
            run_live(n, pct, live_window_s);
          } else {
            run_scenario(n, pct, timeout_s, concurrency);
          }
          std::fflush(stdout);
          _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          std::cerr << "scenario " << n << "/" << pct << "% failed\n";
          return 1;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "poller_bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
