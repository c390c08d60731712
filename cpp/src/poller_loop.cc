// The poller thread: one loop that starts due probes, lets the transfer
// driver move them, feeds results to each worker's RestartPolicy and queues
// events; and the recovery path when the loop's own I/O fails.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "poller_impl.h"

namespace mineru_health {
namespace {

using internal::MutexLock;
using internal::TransferDriver;

using internal::kMaxStartsPerIteration;
using internal::kMaxWaitMs;
// Spare easy handles kept for reuse.
constexpr std::size_t kSpareHandles = 1024;
// Retry delays after a loop error: 100 ms doubling to 5 s.
constexpr auto kFirstRetry = std::chrono::milliseconds(100);
constexpr auto kMaxRetry = std::chrono::seconds(5);

Duration retry_delay(std::uint64_t consecutive_errors) {
  Duration delay = kFirstRetry;
  for (std::uint64_t i = 1; i < consecutive_errors && delay < kMaxRetry; ++i)
    delay *= 2;
  return std::min<Duration>(delay, kMaxRetry);
}

// The probe of a discovered native endpoint got no HTTP answer at all.
bool not_answering(const ProbeResult& r) {
  return r.status == ProbeStatus::kConnectError ||
         r.status == ProbeStatus::kTimeout ||
         r.status == ProbeStatus::kTransportError;
}

}  // namespace

void Poller::Impl::run(std::unique_ptr<TransferDriver> first) noexcept {
  // Declaration order is teardown order in reverse: transfers leave the
  // multi handle first, spare easy handles go next, then the driver (and
  // its multi handle), then the header list the handles pointed at.
  // Null only when out of memory: requests then go without the Accept
  // header, which /health does not need.
  internal::Slist headers(
      curl_slist_append(nullptr, "Accept: application/json"));
  std::unique_ptr<TransferDriver> driver = std::move(first);
  internal::EasyPool pool(kSpareHandles);
  Transfers transfers;
  const internal::RequestSetup setup{config.connect_timeout_s, config.ca_file,
                                     headers.get(), false,
                                     expect.max_body_bytes};
  std::string io_error;
  for (;;) {
    if (io_error.empty()) {
      bool stop = false;
      try {
        io_error = iterate(*driver, pool, transfers, setup, &stop);
      } catch (const std::exception& e) {
        // Allocation failure or a broken invariant: handled like a loop
        // error (dropped probes, backoff, rebuild), never a spin.
        io_error = fmt::format("poller iteration failed: {}", e.what());
      } catch (...) {
        io_error = "poller iteration failed";
      }
      if (stop) break;
      if (io_error.empty()) continue;
    }
    Duration delay{};
    {
      MutexLock lock(mu);
      record_io_error_locked(io_error, now());
      delay = drop_in_flight_locked(transfers, now());
      capped_for = SIZE_MAX;  // a new driver: apply the connection cap again
    }
    transfers.clear();  // detaches every easy handle from the multi handle
    driver.reset();
    if (!wait_before_retry(delay)) break;
    std::string why;
    driver = TransferDriver::create(wake_fd.get(), &why);
    io_error = driver ? "" : "cannot rebuild the transfer driver: " + why;
    if (driver) {
      MutexLock lock(mu);
      ++stats.driver_rebuilds;
    }
  }
}

std::string Poller::Impl::iterate(TransferDriver& driver,
                                  internal::EasyPool& pool,
                                  Transfers& transfers,
                                  const internal::RequestSetup& setup,
                                  bool* stop) {
  std::vector<std::string> to_abort;
  std::vector<Started> to_start;
  std::optional<long> max_connects;
  int wait_ms = 0;
  {
    MutexLock lock(mu);
    if (stop_requested) {
      *stop = true;
      return "";
    }
    ++stats.loop_iterations;
    if (fault) {
      std::string injected = fault();
      if (!injected.empty()) return injected;
    }
    const TimePoint t_now = now();
    to_abort.swap(aborts);
    if (workers.size() != capped_for) {
      // Re-size the cap and the connection cache (one kept-alive connection
      // per worker) when the fleet changes.
      capped_for = workers.size();
      const std::size_t concurrency =
          static_cast<std::size_t>(config.concurrency);
      const std::size_t wanted =
          std::min(std::max<std::size_t>(capped_for, 1), concurrency);
      cap = std::max<std::size_t>(
          1, std::min(concurrency, internal::fd_budget(wanted)));
      max_connects = static_cast<long>(
          std::min(std::max<std::size_t>(capped_for, 1), cap));
    }
    run_ticks_locked(t_now);
    const std::size_t busy = transfers.size();
    const std::size_t slots =
        std::min(kMaxStartsPerIteration, busy < cap ? cap - busy : 0);
    to_start = select_due_locked(t_now, slots);
    wait_ms = wait_ms_locked(t_now, busy + to_start.size() < cap);
    clock_checked_locked();
  }

  if (max_connects) {
    const std::size_t shards = (static_cast<std::size_t>(*max_connects) +
                                internal::kWorkersPerShard - 1) /
                               internal::kWorkersPerShard;
    std::string why = driver.ensure_shards(shards);
    if (why.empty()) why = driver.set_max_connects(*max_connects);
    if (!why.empty()) return why;
  }
  for (const std::string& id : to_abort) {
    auto it = transfers.find(id);
    if (it == transfers.end()) continue;
    pool.give(std::move(it->second));
    transfers.erase(it);
  }

  std::vector<Finished> finished;
  std::vector<std::string> refused;
  std::uint64_t started = 0;
  for (Started& s : to_start) {
    auto t = std::make_unique<internal::Transfer>();
    t->worker_id = s.id;
    t->generation = s.generation;
    t->easy = pool.take();
    std::string why = internal::configure_request(
        *t, s.target.url, s.target.endpoint, s.target.timeout_s, setup);
    if (why.empty()) why = driver.add(*t, std::hash<std::string>{}(s.id));
    if (!why.empty()) {
      ProbeResult r;
      r.worker_id = s.id;
      r.status = ProbeStatus::kTransportError;
      r.detail = "probe not started: " + why;
      r.endpoint = s.target.endpoint;
      r.url = s.target.url;
      finished.push_back(Finished{s.id, s.generation, std::move(r)});
      refused.push_back(std::move(why));
      pool.give(std::move(t));
      continue;
    }
    transfers[s.id] = std::move(t);
    ++started;
  }

  std::vector<TransferDriver::Done> done;
  std::string io_error = driver.run_once(wait_ms, done);
  for (const TransferDriver::Done& d : done) {
    internal::Transfer* t = d.transfer;
    auto it = transfers.find(t->worker_id);
    if (it == transfers.end() || it->second.get() != t) continue;
    finished.push_back(
        Finished{t->worker_id, t->generation,
                 internal::finish_transfer(*t, d.result, expect)});
    pool.give(std::move(it->second));
    transfers.erase(it);
  }

  MutexLock lock(mu);
  const TimePoint t_now = now();
  stats.probes_started += started;
  for (const std::string& why : refused) record_io_error_locked(why, t_now);
  apply_locked(finished, t_now);
  stats.in_flight = transfers.size();
  if (io_error.empty() && refused.empty()) {
    stats.consecutive_io_errors = 0;
    stats.io_failing = false;
  }
  return io_error;
}

void Poller::Impl::run_ticks_locked(TimePoint t_now) {
  for (const std::string& id : deadline_queue.pop_due(t_now, SIZE_MAX)) {
    auto it = workers.find(id);
    if (it == workers.end()) continue;
    Worker& w = it->second;
    const bool was = w.policy.in_rotation();
    after_transition_locked(w, was, w.policy.on_tick(t_now), t_now, true);
  }
}

std::vector<Poller::Impl::Started> Poller::Impl::select_due_locked(
    TimePoint t_now, std::size_t slots) {
  std::vector<Started> due;
  for (const std::string& id : probe_queue.pop_due(t_now, slots)) {
    auto it = workers.find(id);
    if (it == workers.end()) continue;
    Worker& w = it->second;
    ProbeTarget target = probe_target(w);
    // No URL yet: set_url queues the first probe. In flight: its end
    // schedules the next one.
    if (target.url.empty() || w.in_flight) continue;
    w.in_flight = true;
    w.started_at = t_now;
    due.push_back(Started{id, w.generation, std::move(target)});
  }
  return due;
}

void Poller::Impl::update_endpoint_locked(Worker& w, const ProbeResult& r) {
  if (!w.target.health_url.empty()) return;  // explicit: never switches
  if (r.endpoint == ProbeEndpoint::kMain) {
    if (!r.healthy()) return;
    std::optional<std::string> native;
    if (r.native_health_port) {
      native = internal::native_health_url(w.target.url, *r.native_health_port);
    }
    w.discovered = native.value_or("");
    w.native_misses = 0;
    return;
  }
  if (!not_answering(r)) {
    w.native_misses = 0;
  } else if (++w.native_misses >= config.failure_threshold) {
    // Back to the main port, which re-discovers the endpoint if any.
    w.discovered.clear();
    w.native_misses = 0;
  }
}

void Poller::Impl::apply_locked(std::vector<Finished>& finished,
                                TimePoint t_now) {
  for (Finished& f : finished) {
    auto it = workers.find(f.id);
    if (it == workers.end() || it->second.generation != f.generation ||
        !it->second.in_flight) {
      ++stats.probes_discarded;  // the worker moved on meanwhile
      continue;
    }
    Worker& w = it->second;
    w.in_flight = false;
    ++w.probes;
    ++stats.probes_finished;
    w.last_latency_s = f.result.latency_s;
    update_endpoint_locked(w, f.result);
    const bool was = w.policy.in_rotation();
    // Only a non-definitive failure of a worker in rotation asks the guard.
    const bool asks = was && !f.result.healthy() && !f.result.definitive();
    const Transition t = w.policy.on_probe(
        f.result, t_now, asks ? gate_locked() : EjectionGate{});
    w.last_probe = f.result;
    PollerEvent ev;
    ev.kind = PollerEventKind::kProbe;
    ev.worker_id = w.target.id;
    ev.unix_time = internal::unix_now();
    w.counters.count_probe(f.result, ev.unix_time);
    ev.probe = std::move(f.result);
    ev.in_rotation = w.policy.in_rotation();
    events.push(std::move(ev));
    after_transition_locked(w, was, t, t_now, false);
    // One probe in flight at most: the next is due an interval after this
    // one started, or now if it took longer than that.
    probe_queue.schedule(
        f.id, std::max(w.started_at + jittered_interval_locked(), t_now));
  }
}

int Poller::Impl::wait_ms_locked(TimePoint t_now, bool slots_free) {
  TimePoint next = t_now + std::chrono::milliseconds(kMaxWaitMs);
  if (std::optional<TimePoint> d = deadline_queue.next())
    next = std::min(next, *d);
  // At the cap, a due probe must wait for a transfer to finish (the driver
  // returns then), not spin.
  if (slots_free) {
    if (std::optional<TimePoint> p = probe_queue.next())
      next = std::min(next, *p);
  }
  if (next <= t_now) return 0;
  const auto ms =
      std::chrono::ceil<std::chrono::milliseconds>(next - t_now).count();
  return static_cast<int>(std::min<decltype(ms)>(ms, kMaxWaitMs));
}

Duration Poller::Impl::drop_in_flight_locked(const Transfers& transfers,
                                             TimePoint t_now) {
  for (const auto& [id, t] : transfers) {
    auto it = workers.find(id);
    ++stats.probes_discarded;
    if (it == workers.end() || it->second.generation != t->generation) continue;
    // Not the worker's fault: probe it again once the driver is back.
    it->second.in_flight = false;
    probe_queue.schedule(id, t_now);
  }
  stats.in_flight = 0;
  return retry_delay(stats.consecutive_io_errors);
}

bool Poller::Impl::wait_before_retry(Duration delay) {
  MutexLock lock(mu);
  // On the poller's clock, like every other deadline. The real-time wait
  // below ends when the time is up on a steady clock; an injected one is
  // read again whenever the thread is woken.
  const TimePoint until = now() + delay;
  for (;;) {
    const TimePoint t_now = now();
    if (stop_requested || t_now >= until) break;
    clock_checked_locked();  // not due yet: waits on
    retry_cv.wait_for(mu, until - t_now);
  }
  return !stop_requested;
}

}  // namespace mineru_health
