// Poller::sweep (one synchronous round of probes, no policy) and the
// process-wide fd-limit call.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "curl_handles.h"
#include "curl_transfer.h"
#include "mineru_health/poller.h"
#include "poller_impl.h"
#include "unique_fd.h"

namespace mineru_health {
namespace internal {

std::size_t fd_budget(std::size_t wanted) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024 - kReservedFds;
  if (lim.rlim_cur == RLIM_INFINITY) return std::max<std::size_t>(wanted, 1);
  if (lim.rlim_cur <= kReservedFds * 2)
    return static_cast<std::size_t>(lim.rlim_cur / 2);
  return static_cast<std::size_t>(lim.rlim_cur - kReservedFds);
}

}  // namespace internal

namespace {

std::uint64_t limit_value(rlim_t v) {
  return v == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max()
                            : static_cast<std::uint64_t>(v);
}

}  // namespace

FdLimit raise_fd_limit(std::size_t probe_fds) {
  FdLimit out;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    out.error = fmt::format("getrlimit: {}", std::strerror(errno));
    return out;
  }
  out.soft_before = out.soft = limit_value(lim.rlim_cur);
  out.hard = limit_value(lim.rlim_max);
  const rlim_t need =
      probe_fds > std::numeric_limits<rlim_t>::max() - kReservedFds
          ? std::numeric_limits<rlim_t>::max()
          : static_cast<rlim_t>(probe_fds + kReservedFds);
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need) return out;
  const rlim_t target =
      lim.rlim_max == RLIM_INFINITY ? need : std::min(need, lim.rlim_max);
  if (target <= lim.rlim_cur) return out;
  rlimit raised = lim;
  raised.rlim_cur = target;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    out.error = fmt::format("setrlimit: {}", std::strerror(errno));
    return out;
  }
  out.soft = limit_value(target);
  out.raised = true;
  return out;
}

// --- sweep ---

std::vector<ProbeResult> Poller::sweep(const std::vector<Target>& targets,
                                       const HealthConfig& config,
                                       const ProbeExpectations& expect,
                                       SweepStats* stats) {
  using internal::Transfer;
  validate(config);
  internal::ensure_curl_global_init();
  const auto started = SteadyClock::now();
  const ProbeExpectations e = internal::effective(expect, config);
  std::vector<ProbeResult> results(targets.size());

  // Declaration order is teardown order in reverse: transfers leave the
  // multi handle (inside the driver) first, then it goes, then the headers.
  // Null only when out of memory: requests then go without the Accept
  // header, which /health does not need.
  internal::Slist headers(
      curl_slist_append(nullptr, "Accept: application/json"));
  const internal::UniqueFd wake = internal::make_eventfd();
  std::string why;
  std::unique_ptr<internal::TransferDriver> driver =
      internal::TransferDriver::create(wake.get(), &why);
  if (!driver) throw std::runtime_error("sweep: " + why);
  const std::size_t wanted =
      std::min(targets.size(), static_cast<std::size_t>(config.concurrency));
  const std::size_t cap = std::max<std::size_t>(
      1, std::min(static_cast<std::size_t>(config.concurrency),
                  internal::fd_budget(wanted)));
  // One request per target: keeping connections open would only hold fds.
  const internal::RequestSetup setup{config.connect_timeout_s, config.ca_file,
                                     headers.get(), true, e.max_body_bytes};
  internal::EasyPool pool(cap);
  std::vector<std::unique_ptr<Transfer>> in_flight(targets.size());
  std::string io_error = driver->set_max_connects(static_cast<long>(cap));

  std::size_t next = 0;
  std::size_t active = 0;
  std::vector<internal::TransferDriver::Done> done;
  while (io_error.empty()) {
    for (std::size_t started_now = 0;
         active < cap && next < targets.size() &&
         started_now < internal::kMaxStartsPerIteration;
         ++started_now) {
      const std::size_t i = next++;
      const Target& target = targets[i];
      const bool native = !target.health_url.empty();
      if (!native && target.url.empty()) {
        results[i] = internal::not_started(target.id, "no URL");
        continue;
      }
      auto t = std::make_unique<Transfer>();
      t->worker_id = target.id;
      t->index = i;
      t->easy = pool.take();
      std::string refused = internal::configure_request(
          *t,
          native ? target.health_url : internal::main_health_url(target.url),
          native ? ProbeEndpoint::kNative : ProbeEndpoint::kMain,
          config.probe_timeout_s, setup);
      if (refused.empty()) refused = driver->add(*t, i);
      if (!refused.empty()) {
        results[i] =
            internal::not_started(target.id, "probe not started: " + refused);
        pool.give(std::move(t));
        continue;
      }
      in_flight[i] = std::move(t);
      ++active;
    }
    if (active == 0 && next >= targets.size()) break;
    // With slots free and targets left, only give curl a moment to move
    // the transfers already started before adding the next batch.
    const bool more = active < cap && next < targets.size();
    done.clear();
    io_error = driver->run_once(more ? 0 : internal::kMaxWaitMs, done);
    for (const internal::TransferDriver::Done& d : done) {
      const std::size_t i = d.transfer->index;
      results[i] = internal::finish_transfer(*d.transfer, d.result, e);
      pool.give(std::move(in_flight[i]));
      --active;
    }
  }
  if (!io_error.empty()) {
    // The loop itself failed: say so for every target without an answer.
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (i < next && !in_flight[i]) continue;
      results[i] =
          internal::not_started(targets[i].id, "poller I/O error: " + io_error);
      if (in_flight[i]) pool.give(std::move(in_flight[i]));
    }
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
