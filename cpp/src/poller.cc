// The probing loop: one thread, one CURLM handle, every /health request of
// every worker in flight at once (up to the concurrency cap), and one
// RestartPolicy per worker driven under the poller mutex.
//
// Threads: public methods take `mu_`, change the shared state and call
// curl_multi_wakeup (the one curl call documented as safe from another
// thread). Everything else that touches curl runs on the poller thread.
#include "mineru_health/poller.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>

#include "curl_handles.h"

namespace mineru_health {
namespace internal {

void ensure_curl_global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace internal

namespace {

using internal::EasyHandle;
using internal::MultiAttachment;
using internal::MultiHandle;
using internal::Slist;

// A router that never drains its events must not grow without bound; probe
// events are dropped first (audit and restart events are always kept).
constexpr std::size_t kMaxQueuedEvents = 100000;
// File descriptors left for the rest of the process (Python, logs, pipes).
constexpr rlim_t kReservedFds = 256;
// curl's default 16 KiB receive buffer per easy handle costs 160 MB at
// 10,000 concurrent probes; /health bodies are a few hundred bytes.
constexpr long kReceiveBufferBytes = 4096;
constexpr int kMaxWaitMs = 1000;
// New transfers added per loop iteration. A probe's timeout runs from the
// moment it is added, and each curl_multi_perform visits every handle in
// flight; adding 10,000 at once on a small machine makes healthy workers
// time out before the loop gets round to them. Pacing the starts keeps the
// handles in flight close to what the machine can serve within a timeout.
constexpr std::size_t kMaxStartsPerIteration = 500;

Duration to_duration(double seconds) {
  return std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(seconds));
}

// curl reads 0 ms as "no timeout": never round a tiny timeout down to it.
long to_ms_ceil(double seconds) {
  return std::max(1L, static_cast<long>(std::ceil(seconds * 1000.0)));
}

double unix_now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How many sockets the probes may hold at once. Raises the soft
// RLIMIT_NOFILE toward the hard limit when `wanted` would not fit: without
// that, probes beyond ~1,000 fail with EMFILE and look like dead workers.
std::size_t fd_budget(std::size_t wanted) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024 - kReservedFds;
  const rlim_t need = static_cast<rlim_t>(wanted) + kReservedFds;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < need) {
    const rlim_t target =
        lim.rlim_max == RLIM_INFINITY ? need : std::min(need, lim.rlim_max);
    if (target > lim.rlim_cur) {
      rlimit raised = lim;
      raised.rlim_cur = target;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
    }
  }
  if (lim.rlim_cur == RLIM_INFINITY) return std::max<std::size_t>(wanted, 1);
  if (lim.rlim_cur <= kReservedFds * 2)
    return static_cast<std::size_t>(lim.rlim_cur / 2);
  return static_cast<std::size_t>(lim.rlim_cur - kReservedFds);
}

std::string health_url(const std::string& base) {
  std::string url = base;
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url + "/health";
}

// One /health request in flight.
struct Transfer {
  std::string worker_id;
  std::uint64_t generation = 0;
  std::size_t index = 0;  // position in sweep()'s target list
  EasyHandle easy;
  std::string body;
  std::size_t max_body = 0;
  bool truncated = false;
  bool out_of_memory = false;
  char error[CURL_ERROR_SIZE] = {};
  // Declared last so it is destroyed first: the handle leaves the multi
  // handle before `easy` is cleaned up, as curl requires.
  MultiAttachment attached;
};

// Runs inside curl: must not throw. A short count makes curl abort the
// transfer with CURLE_WRITE_ERROR, which is how an oversized body ends.
std::size_t write_body(char* data, std::size_t size, std::size_t count,
                       void* user) noexcept {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  if (t->body.size() + n > t->max_body) {
    t->truncated = true;
    return 0;
  }
  try {
    t->body.append(data, n);
  } catch (...) {
    t->out_of_memory = true;
    return 0;
  }
  return n;
}

// True when the URL's host is a numeric IPv4/IPv6 address (parsed by curl).
bool host_is_ip_literal(const std::string& url) {
  CURLU* u = curl_url();
  if (u == nullptr) return false;
  bool literal = false;
  char* host = nullptr;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      host != nullptr) {
    std::string h = host;
    if (h.size() > 2 && h.front() == '[' && h.back() == ']')
      h = h.substr(1, h.size() - 2);
    unsigned char buf[sizeof(in6_addr)];
    literal = inet_pton(AF_INET, h.c_str(), buf) == 1 ||
              inet_pton(AF_INET6, h.c_str(), buf) == 1;
  }
  curl_free(host);
  curl_url_cleanup(u);
  return literal;
}

struct ProbeSetup {
  const HealthConfig* config;
  const ProbeExpectations* expect;
  curl_slist* headers;
  bool forbid_reuse;
};

// Configures `t.easy` for one GET and adds it to `multi`. Returns "" or why
// it could not start.
std::string start_transfer(CURLM* multi, Transfer& t,
                           const std::string& base_url,
                           const ProbeSetup& setup) {
  CURL* e = t.easy.get();
  if (e == nullptr) return "curl_easy_init failed";
  t.body.clear();
  t.truncated = false;
  t.out_of_memory = false;
  t.error[0] = '\0';
  t.max_body = setup.expect->max_body_bytes;
  const std::string url = health_url(base_url);
  CURLcode rc = CURLE_OK;
  auto set = [&](CURLoption option, auto value) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, option, value);
  };
  set(CURLOPT_URL, url.c_str());
  set(CURLOPT_PRIVATE, static_cast<void*>(&t));
  set(CURLOPT_ERRORBUFFER, t.error);
  set(CURLOPT_WRITEFUNCTION, &write_body);
  set(CURLOPT_WRITEDATA, static_cast<void*>(&t));
  // Signals are the owner's (Python's); curl must not install handlers.
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_CONNECTTIMEOUT_MS, to_ms_ceil(setup.config->connect_timeout_s));
  set(CURLOPT_TIMEOUT_MS, to_ms_ceil(setup.config->probe_timeout_s));
  set(CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
  set(CURLOPT_PROTOCOLS_STR, "http,https");
#else
  set(CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  if (!setup.config->ca_file.empty()) {
    set(CURLOPT_CAINFO, setup.config->ca_file.c_str());
  }
  set(CURLOPT_HTTPHEADER, setup.headers);
  set(CURLOPT_USERAGENT, "mineru-health-probe");
  set(CURLOPT_BUFFERSIZE, kReceiveBufferBytes);
  if (setup.forbid_reuse) set(CURLOPT_FORBID_REUSE, 1L);
  if (setup.forbid_reuse || host_is_ip_literal(url)) {
    // curl 7.88 caches even IP literals per host:port and walks the whole
    // cache on every new connection: with thousands of workers that is
    // quadratic. Nothing to cache for an address, or in a one-shot sweep.
    set(CURLOPT_DNS_CACHE_TIMEOUT, 0L);
  }
  if (rc != CURLE_OK)
    return fmt::format("curl_easy_setopt: {}", curl_easy_strerror(rc));
  t.attached = MultiAttachment(multi, e);
  if (!t.attached.ok()) return "curl_multi_add_handle failed";
  return "";
}

ProbeStatus status_for(CURLcode rc) {
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      return ProbeStatus::kTimeout;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
      return ProbeStatus::kConnectError;
    default:
      return ProbeStatus::kTransportError;
  }
}

ProbeResult finish_transfer(Transfer& t, CURLcode rc,
                            const ProbeExpectations& expect) {
  CURL* e = t.easy.get();
  long http_status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http_status);
  curl_off_t total_us = 0;
  curl_easy_getinfo(e, CURLINFO_TOTAL_TIME_T, &total_us);
  ProbeResult r;
  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.truncated)) {
    r = classify_health_response(http_status, t.body, t.truncated, expect);
  } else {
    r.status = status_for(rc);
    r.http_status = http_status;
    if (t.out_of_memory) {
      r.detail = "out of memory reading the body";
    } else if (t.error[0] != '\0') {
      r.detail = t.error;
    } else {
      r.detail = curl_easy_strerror(rc);
    }
  }
  r.worker_id = t.worker_id;
  r.latency_s = static_cast<double>(total_us) / 1e6;
  return r;
}

ProbeResult not_started(const std::string& id, std::string why) {
  ProbeResult r;
  r.worker_id = id;
  r.status = ProbeStatus::kTransportError;
  r.detail = std::move(why);
  return r;
}

// The config is what the operator set (MINERU_ROUTER_HEALTH_EXPECTED_STATUS,
// ..._MAX_BODY_BYTES); it wins over the caller's expectations.
ProbeExpectations effective(ProbeExpectations expect,
                            const HealthConfig& config) {
  expect.expected_status = config.expected_status;
  expect.max_body_bytes = config.max_body_bytes;
  return expect;
}

// Recycles easy handles: a finished transfer's handle goes back to the pool
// (curl_easy_reset keeps its DNS and connection caches, which live in the
// multi handle anyway).
class EasyPool {
 public:
  explicit EasyPool(std::size_t keep) : keep_(keep) {}
  EasyHandle take() {
    if (spare_.empty()) return EasyHandle(curl_easy_init());
    EasyHandle e = std::move(spare_.back());
    spare_.pop_back();
    curl_easy_reset(e.get());
    return e;
  }
  void give(std::unique_ptr<Transfer> t) {
    t->attached.reset();
    if (t->easy && spare_.size() < keep_) spare_.push_back(std::move(t->easy));
  }

 private:
  std::size_t keep_;
  std::vector<EasyHandle> spare_;
};

struct Due {
  TimePoint at;
  std::uint64_t seq;
  std::string id;
  bool operator>(const Due& other) const { return at > other.at; }
};
using DueQueue = std::priority_queue<Due, std::vector<Due>, std::greater<Due>>;

}  // namespace

const char* to_string(PollerEventKind kind) {
  switch (kind) {
    case PollerEventKind::kProbe:
      return "probe";
    case PollerEventKind::kAudit:
      return "audit";
    case PollerEventKind::kRestartRequested:
      return "restart_requested";
  }
  return "unknown";
}

struct Poller::Impl {
  struct Worker {
    Worker(Target t, RestartPolicy p, std::uint64_t g)
        : target(std::move(t)), policy(std::move(p)), generation(g) {}

    Target target;
    RestartPolicy policy;
    std::uint64_t
        generation;  // changes on add and set_url: stale results are dropped
    std::uint64_t probe_seq = 0;  // the live entry in probe_queue
    std::uint64_t deadline_seq = 0;
    std::optional<TimePoint> scheduled_deadline;
    bool in_flight = false;
    bool overdue =
        false;  // came due while its previous probe was still running
    std::uint64_t probes = 0;
    std::optional<double> last_latency_s;
  };

  struct Started {
    std::string id;
    std::uint64_t generation;
    std::string url;
  };

  struct Finished {
    std::string id;
    std::uint64_t generation;
    ProbeResult result;
  };

  Impl(HealthConfig c, ProbeExpectations e, NowFn n, std::uint64_t seed)
      : config(std::move(c)),
        expect(effective(std::move(e), config)),
        now(n ? std::move(n) : NowFn(SteadyClock::now)),
        rng(seed != 0 ? seed : std::random_device{}()) {
    event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (event_fd < 0) {
      throw std::runtime_error(
          fmt::format("eventfd: {}", std::strerror(errno)));
    }
  }

  ~Impl() {
    if (event_fd >= 0) close(event_fd);
  }

  PolicyOptions options_for(const Target& target) const {
    PolicyOptions o;
    o.failure_threshold = config.failure_threshold;
    o.healthy_threshold = config.healthy_threshold;
    o.backoff_base = to_duration(config.backoff_base_s);
    o.backoff_max = to_duration(config.backoff_max_s);
    o.max_attempts = config.max_attempts;
    o.boot_timeout = to_duration(config.boot_timeout_s);
    o.restartable = target.restartable;
    return o;
  }

  // --- everything below with `_locked` runs under mu ---

  void wake_locked() {
    if (multi) curl_multi_wakeup(multi.get());
  }

  Duration jittered_interval_locked() {
    double factor = 1.0;
    if (config.jitter > 0) {
      std::uniform_real_distribution<double> spread(-config.jitter,
                                                    config.jitter);
      factor += spread(rng);
    }
    return to_duration(config.interval_s * factor);
  }

  void schedule_probe_locked(Worker& w, TimePoint at) {
    w.probe_seq = ++seq;
    probe_queue.push(Due{at, w.probe_seq, w.target.id});
  }

  void refresh_deadline_locked(Worker& w) {
    const std::optional<TimePoint> d = w.policy.next_deadline();
    if (d == w.scheduled_deadline) return;
    w.deadline_seq = ++seq;
    w.scheduled_deadline = d;
    if (d) deadline_queue.push(Due{*d, w.deadline_seq, w.target.id});
  }

  void push_event_locked(PollerEvent event) {
    if (events.size() >= kMaxQueuedEvents &&
        event.kind == PollerEventKind::kProbe) {
      ++dropped_events;
      return;
    }
    const bool was_empty = events.empty();
    events.push_back(std::move(event));
    if (was_empty) {
      const std::uint64_t one = 1;
      // EAGAIN means the counter is already non-zero: readable either way.
      [[maybe_unused]] ssize_t n = write(event_fd, &one, sizeof one);
    }
  }

  void emit_locked(const Worker& w, const Transition& t) {
    const double stamp = unix_now();
    for (const AuditEvent& a : t.events) {
      PollerEvent ev;
      ev.kind = PollerEventKind::kAudit;
      ev.worker_id = w.target.id;
      ev.unix_time = stamp;
      ev.audit = a;
      ev.in_rotation = w.policy.in_rotation();
      push_event_locked(std::move(ev));
    }
    if (t.restart_now) {
      PollerEvent ev;
      ev.kind = PollerEventKind::kRestartRequested;
      ev.worker_id = w.target.id;
      ev.unix_time = stamp;
      ev.in_rotation = w.policy.in_rotation();
      push_event_locked(std::move(ev));
    }
  }

  template <typename Call>
  void report_locked(const std::string& id, Call call) {
    auto it = workers.find(id);
    if (it == workers.end()) return;
    Worker& w = it->second;
    const Transition t = call(w.policy, now());
    emit_locked(w, t);
    refresh_deadline_locked(w);
    wake_locked();
  }

  void run_ticks_locked(TimePoint t_now) {
    while (!deadline_queue.empty() && deadline_queue.top().at <= t_now) {
      const Due d = deadline_queue.top();
      deadline_queue.pop();
      auto it = workers.find(d.id);
      if (it == workers.end() || it->second.deadline_seq != d.seq)
        continue;  // stale
      Worker& w = it->second;
      w.scheduled_deadline.reset();
      const Transition t = w.policy.on_tick(t_now);
      emit_locked(w, t);
      const std::optional<TimePoint> next = w.policy.next_deadline();
      if (next && *next <= t_now) {
        // on_tick had nothing to do at a past deadline: remember it without
        // re-queueing, or this loop would never end.
        w.scheduled_deadline = next;
      } else {
        refresh_deadline_locked(w);
      }
    }
  }

  std::vector<Started> select_due_locked(TimePoint t_now, std::size_t slots) {
    std::vector<Started> due;
    while (slots > 0 && !probe_queue.empty() && probe_queue.top().at <= t_now) {
      const Due d = probe_queue.top();
      probe_queue.pop();
      auto it = workers.find(d.id);
      if (it == workers.end() || it->second.probe_seq != d.seq)
        continue;  // stale
      Worker& w = it->second;
      if (w.target.url.empty()) continue;  // set_url queues the first probe
      if (w.in_flight) {
        w.overdue = true;
        continue;
      }
      w.in_flight = true;
      schedule_probe_locked(w, t_now + jittered_interval_locked());
      due.push_back(Started{w.target.id, w.generation, w.target.url});
      --slots;
    }
    return due;
  }

  void apply_locked(std::vector<Finished>& finished, TimePoint t_now) {
    for (Finished& f : finished) {
      auto it = workers.find(f.id);
      if (it == workers.end() || it->second.generation != f.generation)
        continue;  // stale
      Worker& w = it->second;
      w.in_flight = false;
      ++w.probes;
      w.last_latency_s = f.result.latency_s;
      const Transition t = w.policy.on_probe(f.result, t_now);
      PollerEvent ev;
      ev.kind = PollerEventKind::kProbe;
      ev.worker_id = w.target.id;
      ev.unix_time = unix_now();
      ev.probe = std::move(f.result);
      ev.in_rotation = w.policy.in_rotation();
      push_event_locked(std::move(ev));
      emit_locked(w, t);
      refresh_deadline_locked(w);
      if (w.overdue) {
        w.overdue = false;
        schedule_probe_locked(w, t_now);
      }
    }
  }

  // Milliseconds until the next probe or policy deadline, at most 1 s.
  int wait_ms_locked(TimePoint t_now, bool slots_free) {
    TimePoint next = t_now + std::chrono::milliseconds(kMaxWaitMs);
    while (!deadline_queue.empty()) {
      const Due& d = deadline_queue.top();
      auto it = workers.find(d.id);
      if (it != workers.end() && it->second.deadline_seq == d.seq) {
        next = std::min(next, d.at);
        break;
      }
      deadline_queue.pop();
    }
    // At the cap, a due probe must wait for a transfer to finish (curl
    // returns from the poll then), not spin.
    if (slots_free) {
      while (!probe_queue.empty()) {
        const Due& d = probe_queue.top();
        auto it = workers.find(d.id);
        if (it != workers.end() && it->second.probe_seq == d.seq) {
          next = std::min(next, d.at);
          break;
        }
        probe_queue.pop();
      }
    }
    if (next <= t_now) return 0;
    const auto ms =
        std::chrono::ceil<std::chrono::milliseconds>(next - t_now).count();
    return static_cast<int>(std::min<decltype(ms)>(ms, kMaxWaitMs));
  }

  // --- the poller thread ---

  void run() noexcept {
    CURLM* m = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      m = multi.get();
    }
    // Declaration order is teardown order in reverse: transfers leave the
    // multi handle first, then spare easy handles go, then the header list
    // they pointed at.
    Slist headers(curl_slist_append(nullptr, "Accept: application/json"));
    EasyPool pool(1024);
    std::map<std::string, std::unique_ptr<Transfer>> transfers;
    std::size_t known_workers = SIZE_MAX;
    std::size_t cap = 1;
    const ProbeSetup setup{&config, &expect, headers.get(), false};

    for (;;) {
      try {
        std::vector<std::string> to_abort;
        std::vector<Started> to_start;
        std::size_t worker_count = 0;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop_requested) break;
          const TimePoint t_now = now();
          to_abort.swap(aborts);
          worker_count = workers.size();
          if (worker_count != known_workers) {
            // Re-size the fd budget and the connection cache (one kept-alive
            // connection per worker) when the fleet changes.
            known_workers = worker_count;
            const std::size_t budget = fd_budget(std::min<std::size_t>(
                std::max<std::size_t>(worker_count, 1),
                static_cast<std::size_t>(config.concurrency)));
            cap = std::max<std::size_t>(
                1,
                std::min(static_cast<std::size_t>(config.concurrency), budget));
            curl_multi_setopt(
                m, CURLMOPT_MAXCONNECTS,
                static_cast<long>(
                    std::min(std::max<std::size_t>(worker_count, 1), cap)));
          }
          run_ticks_locked(t_now);
          const std::size_t slots =
              std::min(kMaxStartsPerIteration,
                       transfers.size() < cap ? cap - transfers.size() : 0);
          to_start = select_due_locked(t_now, slots);
        }

        for (const std::string& id : to_abort) {
          auto it = transfers.find(id);
          if (it == transfers.end()) continue;
          pool.give(std::move(it->second));
          transfers.erase(it);
        }

        std::vector<Finished> finished;
        for (Started& s : to_start) {
          auto t = std::make_unique<Transfer>();
          t->worker_id = s.id;
          t->generation = s.generation;
          t->easy = pool.take();
          std::string why = start_transfer(m, *t, s.url, setup);
          if (!why.empty()) {
            finished.push_back(Finished{s.id, s.generation,
                                        not_started(s.id, std::move(why))});
            pool.give(std::move(t));
            continue;
          }
          transfers[s.id] = std::move(t);
        }

        int running = 0;
        curl_multi_perform(m, &running);
        int left = 0;
        while (CURLMsg* msg = curl_multi_info_read(m, &left)) {
          if (msg->msg != CURLMSG_DONE) continue;
          void* priv = nullptr;
          curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
          auto* t = static_cast<Transfer*>(priv);
          const CURLcode rc = msg->data.result;
          auto it = transfers.find(t->worker_id);
          if (it == transfers.end() || it->second.get() != t) continue;
          finished.push_back(Finished{t->worker_id, t->generation,
                                      finish_transfer(*t, rc, expect)});
          pool.give(std::move(it->second));
          transfers.erase(it);
        }

        int wait_ms = 0;
        {
          std::lock_guard<std::mutex> lock(mu);
          const TimePoint t_now = now();
          apply_locked(finished, t_now);
          if (stop_requested) break;
          wait_ms = wait_ms_locked(t_now, transfers.size() < cap);
        }
        curl_multi_poll(m, nullptr, 0, wait_ms, nullptr);
      } catch (const std::exception& e) {
        // Only allocation failure or a broken invariant lands here; keep
        // probing rather than take the router down, but don't spin.
        std::fprintf(stderr, "mineru_health poller: dropped an iteration: %s\n",
                     e.what());
        curl_multi_poll(m, nullptr, 0, 100, nullptr);
      } catch (...) {
        std::fprintf(stderr, "mineru_health poller: dropped an iteration\n");
        curl_multi_poll(m, nullptr, 0, 100, nullptr);
      }
    }
  }

  HealthConfig config;
  ProbeExpectations expect;
  NowFn now;
  int event_fd = -1;

  mutable std::mutex mu;  // guards everything below
  std::map<std::string, Worker> workers;
  DueQueue probe_queue;
  DueQueue deadline_queue;
  std::vector<std::string> aborts;  // worker ids whose transfer must be dropped
  std::deque<PollerEvent> events;
  std::uint64_t dropped_events = 0;
  std::mt19937_64 rng;
  std::uint64_t seq = 0;
  std::uint64_t next_generation = 1;
  bool stop_requested = false;
  MultiHandle multi;  // set while the thread runs; other threads only wake it

  std::mutex lifecycle_mu;  // serializes start() and stop()
  std::thread thread;
};

Poller::Poller(HealthConfig config, ProbeExpectations expect, NowFn now,
               std::uint64_t seed) {
  validate(config);
  internal::ensure_curl_global_init();
  impl_ = std::make_unique<Impl>(std::move(config), std::move(expect),
                                 std::move(now), seed);
}

Poller::~Poller() { stop(); }

void Poller::add_worker(const Target& target) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  const TimePoint t_now = s.now();
  auto old = s.workers.find(target.id);
  if (old != s.workers.end()) {
    if (old->second.in_flight) s.aborts.push_back(target.id);
    s.workers.erase(old);
  }
  Impl::Worker w(target, RestartPolicy(s.options_for(target), t_now),
                 s.next_generation++);
  // Spread first probes over one interval so a fleet added at once does not
  // probe in lock-step forever after.
  std::uniform_real_distribution<double> first(0.0, s.config.interval_s);
  s.schedule_probe_locked(w, t_now + to_duration(first(s.rng)));
  s.refresh_deadline_locked(w);
  s.workers.emplace(target.id, std::move(w));
  s.wake_locked();
}

void Poller::remove_worker(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->workers.find(id);
  if (it == impl_->workers.end()) return;
  if (it->second.in_flight) impl_->aborts.push_back(id);
  impl_->workers.erase(it);
  impl_->wake_locked();
}

void Poller::set_url(const std::string& id, const std::string& url) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->workers.find(id);
  if (it == impl_->workers.end()) return;
  Impl::Worker& w = it->second;
  w.target.url = url;
  w.generation = impl_->next_generation++;
  if (w.in_flight) {
    impl_->aborts.push_back(id);
    w.in_flight = false;
    w.overdue = false;
  }
  // The restarted worker is probed at once; its policy state is untouched.
  impl_->schedule_probe_locked(w, impl_->now());
  impl_->wake_locked();
}

void Poller::start() {
  std::lock_guard<std::mutex> life(impl_->lifecycle_mu);
  if (impl_->thread.joinable()) return;
  MultiHandle multi(curl_multi_init());
  if (!multi) throw std::runtime_error("curl_multi_init failed");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->multi = std::move(multi);
    impl_->stop_requested = false;
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

void Poller::stop() {
  std::lock_guard<std::mutex> life(impl_->lifecycle_mu);
  if (!impl_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop_requested = true;
    impl_->wake_locked();
  }
  impl_->thread.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  // The thread has removed every easy handle; the multi handle goes last.
  impl_->multi.reset();
  impl_->aborts.clear();
  const TimePoint t_now = impl_->now();
  for (auto& [id, w] : impl_->workers) {
    if (w.in_flight || w.overdue) {
      // Its transfer died with the thread: probe again after a restart.
      w.in_flight = false;
      w.overdue = false;
      impl_->schedule_probe_locked(w, t_now);
    }
  }
}

bool Poller::running() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->multi != nullptr && !impl_->stop_requested;
}

void Poller::report_process_exit(const std::string& id,
                                 const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->report_locked(id, [&](RestartPolicy& p, TimePoint t) {
    return p.on_process_exit(reason, t);
  });
}

void Poller::report_passive_failure(const std::string& id,
                                    const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->report_locked(id, [&](RestartPolicy& p, TimePoint t) {
    return p.on_passive_failure(reason, t);
  });
}

void Poller::report_restart_failed(const std::string& id,
                                   const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->report_locked(id, [&](RestartPolicy& p, TimePoint t) {
    return p.on_restart_failed(reason, t);
  });
}

int Poller::notify_fd() const { return impl_->event_fd; }

std::vector<PollerEvent> Poller::drain_events() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Reset the eventfd under the lock: a producer that finds the queue empty
  // after this point writes it again, so no wake-up is lost.
  std::uint64_t counter = 0;
  [[maybe_unused]] ssize_t n = read(impl_->event_fd, &counter, sizeof counter);
  std::vector<PollerEvent> out(std::make_move_iterator(impl_->events.begin()),
                               std::make_move_iterator(impl_->events.end()));
  impl_->events.clear();
  return out;
}

std::vector<WorkerStatus> Poller::statuses() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const TimePoint t_now = impl_->now();
  std::vector<WorkerStatus> out;
  out.reserve(impl_->workers.size());
  for (const auto& [id, w] : impl_->workers) {
    WorkerStatus s;
    s.id = id;
    s.url = w.target.url;
    s.restartable = w.target.restartable;
    s.phase = w.policy.phase();
    s.in_rotation = w.policy.in_rotation();
    s.consecutive_failures = w.policy.consecutive_failures();
    s.attempt = w.policy.attempt();
    if (auto at = w.policy.next_restart_at()) {
      s.next_restart_in_s = std::chrono::duration<double>(*at - t_now).count();
    }
    s.last_error = w.policy.last_error();
    s.last_latency_s = w.last_latency_s;
    s.probes = w.probes;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ProbeResult> Poller::sweep(const std::vector<Target>& targets,
                                       const HealthConfig& config,
                                       const ProbeExpectations& expect,
                                       SweepStats* stats) {
  validate(config);
  internal::ensure_curl_global_init();
  const auto started = SteadyClock::now();
  const ProbeExpectations e = effective(expect, config);
  std::vector<ProbeResult> results(targets.size());

  MultiHandle multi(curl_multi_init());
  if (!multi) throw std::runtime_error("curl_multi_init failed");
  const std::size_t wanted =
      std::min(targets.size(), static_cast<std::size_t>(config.concurrency));
  const std::size_t cap = std::max<std::size_t>(
      1, std::min(static_cast<std::size_t>(config.concurrency),
                  fd_budget(wanted)));
  curl_multi_setopt(multi.get(), CURLMOPT_MAXCONNECTS, static_cast<long>(cap));
  Slist headers(curl_slist_append(nullptr, "Accept: application/json"));
  // One request per target: keeping connections open would only hold fds.
  const ProbeSetup setup{&config, &e, headers.get(), true};
  EasyPool pool(cap);
  std::vector<std::unique_ptr<Transfer>> in_flight(targets.size());

  std::size_t next = 0;
  std::size_t active = 0;
  for (;;) {
    for (std::size_t started_now = 0; active < cap && next < targets.size() &&
                                      started_now < kMaxStartsPerIteration;
         ++started_now) {
      const std::size_t i = next++;
      const Target& target = targets[i];
      if (target.url.empty()) {
        results[i] = not_started(target.id, "no URL");
        continue;
      }
      auto t = std::make_unique<Transfer>();
      t->worker_id = target.id;
      t->index = i;
      t->easy = pool.take();
      std::string why = start_transfer(multi.get(), *t, target.url, setup);
      if (!why.empty()) {
        results[i] = not_started(target.id, std::move(why));
        pool.give(std::move(t));
        continue;
      }
      in_flight[i] = std::move(t);
      ++active;
    }
    int running = 0;
    curl_multi_perform(multi.get(), &running);
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi.get(), &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      void* priv = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
      auto* t = static_cast<Transfer*>(priv);
      const std::size_t i = t->index;
      results[i] = finish_transfer(*t, msg->data.result, e);
      pool.give(std::move(in_flight[i]));
      --active;
    }
    if (active == 0 && next >= targets.size()) break;
    // With slots free and targets left, only give curl a moment to move
    // the transfers already started before adding the next batch.
    const bool more = active < cap && next < targets.size();
    curl_multi_poll(multi.get(), nullptr, 0, more ? 0 : kMaxWaitMs, nullptr);
  }

  if (stats != nullptr) {
    stats->probes = results.size();
    stats->healthy = static_cast<std::size_t>(
        std::count_if(results.begin(), results.end(),
                      [](const ProbeResult& r) { return r.healthy(); }));
    stats->wall_s =
        std::chrono::duration<double>(SteadyClock::now() - started).count();
  }
  return results;
}

}  // namespace mineru_health
