// The Poller's public methods and the state helpers they share with the
// thread (poller_loop.cc). The sweep and the fd limit are in
// poller_sweep.cc.
#include "mineru_health/poller.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "curl_handles.h"
#include "curl_transfer.h"
#include "poller_impl.h"

namespace mineru_health {
namespace internal {

void ensure_curl_global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Nothing to add on failure: curl is then unusable, every later
    // curl_*_init returns null, and start()/sweep() report that.
    [[maybe_unused]] const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  });
}

double unix_now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Duration to_duration(double seconds) {
  return std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(seconds));
}

ProbeExpectations effective(ProbeExpectations expect,
                            const HealthConfig& config) {
  expect.expected_status = config.expected_status;
  expect.max_body_bytes = config.max_body_bytes;
  return expect;
}

ProbeResult not_started(const std::string& id, std::string why) {
  ProbeResult r;
  r.worker_id = id;
  r.status = ProbeStatus::kTransportError;
  r.detail = std::move(why);
  return r;
}

void PollerTestPeer::inject_io_fault(Poller& poller,
                                     std::function<std::string()> fault) {
  internal::MutexLock lock(poller.impl_->mu);
  poller.impl_->fault = std::move(fault);
  poller.impl_->wake_locked();
}

bool PollerTestPeer::sync(Poller& poller, std::chrono::milliseconds limit) {
  Poller::Impl& s = *poller.impl_;
  internal::MutexLock lock(s.mu);
  if (!s.thread_running || s.stop_requested) return false;
  const std::uint64_t before = s.clock_checks;
  s.wake_locked();
  s.retry_cv.notify_all();
  // Real time: this bounds the wait for the thread, not for the clock.
  const auto give_up = SteadyClock::now() + limit;
  while (s.clock_checks == before) {
    if (s.clock_checked_cv.wait_until(s.mu, give_up) ==
        std::cv_status::timeout) {
      return s.clock_checks != before;
    }
  }
  return true;
}

std::optional<TimePoint> PollerTestPeer::probe_due(const Poller& poller,
                                                   const std::string& id) {
  internal::MutexLock lock(poller.impl_->mu);
  return poller.impl_->probe_queue.due_at(id);
}

}  // namespace internal

namespace {

using internal::MutexLock;

constexpr std::size_t kMaxQueuedEvents = 100000;

std::optional<double> seconds_until(std::optional<TimePoint> at,
                                    TimePoint t_now) {
  if (!at) return std::nullopt;
  return std::chrono::duration<double>(*at - t_now).count();
}

}  // namespace

const char* to_string(PollerEventKind kind) {
  switch (kind) {
    case PollerEventKind::kProbe:
      return "probe";
    case PollerEventKind::kAudit:
      return "audit";
    case PollerEventKind::kRestartRequested:
      return "restart_requested";
    case PollerEventKind::kError:
      return "error";
  }
  return "unknown";
}

// --- Impl helpers shared with poller_loop.cc ---

Poller::Impl::Worker::Worker(Target t, RestartPolicy p, std::uint64_t g)
    : target(std::move(t)),
      main_url(target.url.empty() ? "" : internal::main_health_url(target.url)),
      policy(std::move(p)),
      generation(g) {}

Poller::Impl::Impl(HealthConfig c, ProbeExpectations e, NowFn n,
                   std::uint64_t seed)
    : config(std::move(c)),
      expect(internal::effective(std::move(e), config)),
      now(n ? std::move(n) : NowFn(SteadyClock::now)),
      wake_fd(internal::make_eventfd()),
      events(kMaxQueuedEvents),
      rng(seed != 0 ? seed : std::random_device{}()) {}

PolicyOptions Poller::Impl::options_for(const Target& target) const {
  PolicyOptions o;
  o.failure_threshold = config.failure_threshold;
  o.healthy_threshold = config.healthy_threshold;
  o.backoff_base = internal::to_duration(config.backoff_base_s);
  o.backoff_max = internal::to_duration(config.backoff_max_s);
  o.max_attempts = config.max_attempts;
  o.boot_timeout = internal::to_duration(config.boot_timeout_s);
  o.stable_window = internal::to_duration(config.stable_window_s);
  o.restartable = target.restartable;
  return o;
}

Poller::Impl::ProbeTarget Poller::Impl::probe_target(const Worker& w) const {
  if (!w.target.health_url.empty()) {
    return {w.target.health_url, ProbeEndpoint::kNative,
            config.probe_timeout_s};
  }
  if (w.target.url.empty()) return {};
  if (!w.discovered.empty()) {
    return {w.discovered, ProbeEndpoint::kNative, config.probe_timeout_s};
  }
  return {w.main_url, ProbeEndpoint::kMain, config.main_port_timeout_s};
}

void Poller::Impl::wake_locked() {
  const std::uint64_t one = 1;
  // EAGAIN: the counter is already non-zero, the thread will wake anyway.
  if (write(wake_fd.get(), &one, sizeof one) < 0 && errno != EAGAIN) {
    ++stats.event_notify_errors;
  }
}

Duration Poller::Impl::jittered_interval_locked() {
  double factor = 1.0;
  if (config.jitter > 0) {
    std::uniform_real_distribution<double> spread(-config.jitter,
                                                  config.jitter);
    factor += spread(rng);
  }
  return internal::to_duration(config.interval_s * factor);
}

EjectionGate Poller::Impl::gate_locked() const {
  const std::size_t n = workers.size();
  const std::size_t out = n - in_rotation;
  const std::size_t by_percent =
      n * static_cast<std::size_t>(config.max_ejection_percent) / 100;
  const std::size_t max_out = std::min(by_percent, n > 0 ? n - 1 : 0);
  if (out < max_out) return EjectionGate{};
  return EjectionGate{
      false,
      fmt::format("{} of {} workers already out of rotation; "
                  "max_ejection_percent={} allows {} and keeps one in rotation",
                  out, n, config.max_ejection_percent, max_out)};
}

WorkerStatus Poller::Impl::snapshot_locked(const Worker& w,
                                           TimePoint t_now) const {
  WorkerStatus s;
  s.id = w.target.id;
  s.url = w.target.url;
  s.health_url = w.target.health_url;
  const ProbeTarget target = probe_target(w);
  s.probe_url = target.url;
  s.endpoint = target.endpoint;
  s.restartable = w.target.restartable;
  const RestartPolicy& p = w.policy;
  s.phase = p.phase();
  s.in_rotation = p.in_rotation();
  s.consecutive_failures = p.consecutive_failures();
  s.consecutive_successes = p.consecutive_successes();
  s.attempt = p.attempt();
  s.next_restart_in_s = seconds_until(p.next_restart_at(), t_now);
  s.boot_deadline_in_s = seconds_until(p.boot_deadline(), t_now);
  s.stable_in_s = seconds_until(p.stable_at(), t_now);
  s.awaiting_process = p.awaiting_process();
  s.ejection_suppressed = p.ejection_suppressed();
  s.last_error = p.last_error();
  s.last_cause = p.last_cause();
  s.last_exit_code = p.last_exit_code();
  s.last_latency_s = w.last_latency_s;
  s.last_probe = w.last_probe;
  s.probes = w.probes;
  s.counters = w.counters;
  return s;
}

void Poller::Impl::after_transition_locked(Worker& w, bool was_in_rotation,
                                           const Transition& t, TimePoint t_now,
                                           bool after_tick) {
  const bool in = w.policy.in_rotation();
  if (in && !was_in_rotation) ++in_rotation;
  if (!in && was_in_rotation) --in_rotation;
  if (!t.events.empty() || t.restart_now) {
    const double stamp = internal::unix_now();
    for (const AuditEvent& a : t.events) {
      w.counters.count_audit(a);
      if (a.action == AuditAction::kEjectionSuppressed)
        ++stats.ejections_suppressed;
      PollerEvent ev;
      ev.kind = PollerEventKind::kAudit;
      ev.worker_id = w.target.id;
      ev.unix_time = stamp;
      ev.audit = a;
      ev.in_rotation = in;
      events.push(std::move(ev));
    }
    if (t.restart_now) {
      PollerEvent ev;
      ev.kind = PollerEventKind::kRestartRequested;
      ev.worker_id = w.target.id;
      ev.unix_time = stamp;
      ev.in_rotation = in;
      events.push(std::move(ev));
    }
  }
  refresh_deadline_locked(w, t_now, after_tick);
}

void Poller::Impl::refresh_deadline_locked(const Worker& w, TimePoint t_now,
                                           bool after_tick) {
  std::optional<TimePoint> d = w.policy.next_deadline();
  if (!d) {
    deadline_queue.cancel(w.target.id);
    return;
  }
  // on_tick acts on every deadline it reports; should one ever be left in
  // the past after a tick, retry it a second later rather than spin.
  if (after_tick && *d <= t_now) d = t_now + std::chrono::seconds(1);
  if (deadline_queue.due_at(w.target.id) == d) return;
  deadline_queue.schedule(w.target.id, *d);
}

void Poller::Impl::record_io_error_locked(const std::string& error,
                                          TimePoint t_now) {
  ++stats.io_errors;
  ++stats.consecutive_io_errors;
  stats.io_failing = true;
  stats.last_io_error = error;
  // Never hidden (stats count every one), never a flood: one event a second.
  if (last_error_event && t_now - *last_error_event < std::chrono::seconds(1))
    return;
  last_error_event = t_now;
  PollerEvent ev;
  ev.kind = PollerEventKind::kError;
  ev.unix_time = internal::unix_now();
  ev.error = error;
  events.push(std::move(ev));
}

void Poller::Impl::clock_checked_locked() {
  ++clock_checks;
  clock_checked_cv.notify_all();
}

template <typename Call>
void Poller::Impl::report_locked(const std::string& id, Call call) {
  auto it = workers.find(id);
  if (it == workers.end()) return;
  Worker& w = it->second;
  const TimePoint t_now = now();
  const bool was = w.policy.in_rotation();
  const Transition t = call(w.policy, t_now, gate_locked());
  after_transition_locked(w, was, t, t_now, false);
  wake_locked();
}

// --- public methods ---

Poller::Poller(HealthConfig config, ProbeExpectations expect, NowFn now,
               std::uint64_t seed) {
  validate(config);
  internal::ensure_curl_global_init();
  impl_ = std::make_unique<Impl>(std::move(config), std::move(expect),
                                 std::move(now), seed);
}

Poller::~Poller() { stop(); }

void Poller::add_worker(const Target& target) {
  Impl& s = *impl_;
  MutexLock lock(s.mu);
  const TimePoint t_now = s.now();
  auto old = s.workers.find(target.id);
  if (old != s.workers.end()) {
    if (old->second.in_flight) s.aborts.push_back(target.id);
    if (old->second.policy.in_rotation()) --s.in_rotation;
    s.workers.erase(old);
  }
  Impl::Worker w(target, RestartPolicy(s.options_for(target), t_now),
                 s.next_generation++);
  // Spread first probes over one interval so a fleet added at once does not
  // probe in lock-step forever after.
  std::uniform_real_distribution<double> first(0.0, s.config.interval_s);
  s.probe_queue.schedule(target.id,
                         t_now + internal::to_duration(first(s.rng)));
  auto [it, inserted] = s.workers.emplace(target.id, std::move(w));
  s.refresh_deadline_locked(it->second, t_now, false);
  s.wake_locked();
}

void Poller::remove_worker(const std::string& id) {
  Impl& s = *impl_;
  MutexLock lock(s.mu);
  auto it = s.workers.find(id);
  if (it == s.workers.end()) return;
  if (it->second.in_flight) s.aborts.push_back(id);
  if (it->second.policy.in_rotation()) --s.in_rotation;
  s.workers.erase(it);
  s.probe_queue.cancel(id);
  s.deadline_queue.cancel(id);
  s.wake_locked();
}

void Poller::set_url(const std::string& id, const std::string& url,
                     const std::string& health_url) {
  Impl& s = *impl_;
  MutexLock lock(s.mu);
  auto it = s.workers.find(id);
  if (it == s.workers.end()) return;
  Impl::Worker& w = it->second;
  const TimePoint t_now = s.now();
  w.target.url = url;
  w.target.health_url = health_url;
  w.main_url = url.empty() ? "" : internal::main_health_url(url);
  w.discovered.clear();
  w.native_misses = 0;
  w.generation = s.next_generation++;
  if (w.in_flight) {
    s.aborts.push_back(id);
    w.in_flight = false;
  }
  if (url.empty() && health_url.empty()) {
    s.probe_queue.cancel(id);
  } else {
    // The (re)started worker is probed at once, and its boot deadline runs
    // from now.
    s.probe_queue.schedule(id, t_now);
    const bool was = w.policy.in_rotation();
    s.after_transition_locked(w, was, w.policy.on_process_started(t_now), t_now,
                              false);
  }
  s.wake_locked();
}

void Poller::start() {
  Impl& s = *impl_;
  MutexLock life(s.lifecycle_mu);
  if (s.thread.joinable()) return;
  std::string why;
  std::unique_ptr<internal::TransferDriver> driver =
      internal::TransferDriver::create(s.wake_fd.get(), &why);
  if (!driver) throw std::runtime_error("cannot start the poller: " + why);
  {
    MutexLock lock(s.mu);
    s.stop_requested = false;
    s.thread_running = true;
    s.capped_for = SIZE_MAX;  // a new driver: apply the connection cap again
  }
  s.thread = std::thread(
      [&s, d = std::move(driver)]() mutable { s.run(std::move(d)); });
}

void Poller::stop() {
  Impl& s = *impl_;
  MutexLock life(s.lifecycle_mu);
  if (!s.thread.joinable()) return;
  {
    MutexLock lock(s.mu);
    s.stop_requested = true;
    s.wake_locked();
  }
  s.retry_cv.notify_all();
  s.thread.join();
  MutexLock lock(s.mu);
  s.thread_running = false;
  s.aborts.clear();
  s.stats.in_flight = 0;
  const TimePoint t_now = s.now();
  for (auto& [id, w] : s.workers) {
    if (w.in_flight) {
      // Its transfer died with the thread: probe again after a restart.
      w.in_flight = false;
      s.probe_queue.schedule(id, t_now);
    }
  }
}

bool Poller::running() const {
  MutexLock lock(impl_->mu);
  return impl_->thread_running && !impl_->stop_requested;
}

void Poller::report_process_exit(const std::string& id,
                                 const std::string& reason,
                                 std::optional<int> exit_code) {
  MutexLock lock(impl_->mu);
  impl_->report_locked(id,
                       [&](RestartPolicy& p, TimePoint t, const EjectionGate&) {
                         return p.on_process_exit(reason, exit_code, t);
                       });
}

void Poller::report_passive_failure(const std::string& id,
                                    const std::string& reason) {
  MutexLock lock(impl_->mu);
  impl_->report_locked(id,
                       [&](RestartPolicy& p, TimePoint t, const EjectionGate&) {
                         return p.on_passive_failure(reason, t);
                       });
}

void Poller::report_restart_failed(const std::string& id,
                                   const std::string& reason) {
  MutexLock lock(impl_->mu);
  impl_->report_locked(id,
                       [&](RestartPolicy& p, TimePoint t, const EjectionGate&) {
                         return p.on_restart_failed(reason, t);
                       });
}

int Poller::notify_fd() const { return impl_->events.fd(); }

std::vector<PollerEvent> Poller::drain_events() {
  return impl_->events.drain();
}

std::vector<WorkerStatus> Poller::statuses() const {
  MutexLock lock(impl_->mu);
  const TimePoint t_now = impl_->now();
  std::vector<WorkerStatus> out;
  out.reserve(impl_->workers.size());
  for (const auto& [id, w] : impl_->workers) {
    out.push_back(impl_->snapshot_locked(w, t_now));
  }
  return out;
}

std::optional<WorkerStatus> Poller::status(const std::string& id) const {
  MutexLock lock(impl_->mu);
  auto it = impl_->workers.find(id);
  if (it == impl_->workers.end()) return std::nullopt;
  return impl_->snapshot_locked(it->second, impl_->now());
}

PollerStats Poller::stats() const {
  MutexLock lock(impl_->mu);
  PollerStats s = impl_->stats;
  const internal::EventQueue::Counts counts = impl_->events.counts();
  s.dropped_events = counts.dropped;
  s.queued_events = counts.queued;
  s.event_notify_errors += counts.notify_errors;
  s.workers = impl_->workers.size();
  s.in_rotation = impl_->in_rotation;
  s.concurrency_cap = impl_->cap;
  return s;
}

}  // namespace mineru_health
