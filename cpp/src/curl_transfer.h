// Health-probe transfers and the one loop that drives them (private to the
// core library): a Transfer is one GET in flight; TransferDriver owns the
// CURLM handle and an epoll set and moves every transfer with
// curl_multi_socket_action, so each wake-up costs what is active, not what
// is in flight.
//
//   auto driver = TransferDriver::create(wake_fd, &error);
//   Transfer t;  t.easy = pool.take();
//   if (configure_request(t, url, ProbeEndpoint::kMain, 60.0, setup).empty()
//       && driver->add(t).empty()) { ... }
//   std::vector<TransferDriver::Done> done;
//   std::string io_error = driver->run_once(wait_ms, done);
//   for (auto& d : done) results.push_back(finish_transfer(*d.transfer, ...));
//
// Why socket_action: curl_multi_poll and curl_multi_perform (curl 7.88)
// visit every transfer in flight on every call. A hung worker keeps its
// transfer in flight for a whole timeout instead of a millisecond, so with
// thousands of hung workers each wake-up (every healthy answer) walked
// thousands of idle sockets: a timed-out probe cost about ten times a
// healthy one. epoll reports only ready sockets and curl keeps its timers
// in a splay tree, so a hung transfer costs nothing until it times out.
//
// Why shards: curl 7.88's curl_multi_remove_handle walks the multi handle's
// whole connection cache whenever the transfer left its connection alive
// (to close CONNECT_ONLY ones), so with one kept-alive connection per
// worker every probe cost O(workers); at 10,000 workers that walk was over
// half the poller's CPU. Workers are spread over several multi handles
// (kWorkersPerShard each) sharing one epoll set, which bounds the walk.
//
// Errors are values: configure/add/run_once return "" or what failed. After
// run_once fails the driver is not to be trusted; the owner drops its
// transfers, destroys it and builds a new one. Not thread-safe: one thread
// owns a driver and its transfers (only the wake fd is written by others).
#ifndef MINERU_HEALTH_SRC_CURL_TRANSFER_H_
#define MINERU_HEALTH_SRC_CURL_TRANSFER_H_

#include <curl/curl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "curl_handles.h"
#include "mineru_health/probe.h"
#include "unique_fd.h"

namespace mineru_health::internal {

// Workers per CURLM handle (see "Why shards").
inline constexpr std::size_t kWorkersPerShard = 256;

// One /health request in flight.
struct Transfer {
  std::string worker_id;
  std::uint64_t generation = 0;
  std::size_t index = 0;  // position in sweep()'s target list
  ProbeEndpoint endpoint = ProbeEndpoint::kMain;
  std::string url;
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

// What every request of one poller (or sweep) shares.
struct RequestSetup {
  double connect_timeout_s = 0.5;
  std::string ca_file;            // "" = the system store
  curl_slist* headers = nullptr;  // must outlive the easy handles
  bool forbid_reuse = false;      // one-shot sweeps keep no connections
  std::size_t max_body_bytes = 64 * 1024;
};

// Configures t.easy for one GET of `url` (every curl_easy_setopt checked).
// Returns "" or why it could not (a local failure, never the worker's).
std::string configure_request(Transfer& t, const std::string& url,
                              ProbeEndpoint endpoint, double timeout_s,
                              const RequestSetup& setup);

// The probe result of a finished transfer (`result` as curl reported it).
ProbeResult finish_transfer(const Transfer& t, CURLcode result,
                            const ProbeExpectations& expect);

// `base` + "/health" (trailing slashes dropped).
std::string main_health_url(const std::string& base);
// http://<host of base>:<port>/health; nullopt when `base` does not parse or
// the port is not 1..65535. Only the port comes from the worker's answer.
std::optional<std::string> native_health_url(const std::string& base, int port);

// Recycles easy handles: a finished transfer's handle goes back to the pool
// (curl_easy_reset keeps its DNS and connection caches, which live in the
// multi handle anyway).
class EasyPool {
 public:
  explicit EasyPool(std::size_t keep) : keep_(keep) {}
  EasyHandle take();
  // Detaches `t` from its multi handle and keeps its easy handle.
  void give(std::unique_ptr<Transfer> t);

 private:
  std::size_t keep_;
  std::vector<EasyHandle> spare_;
};

class TransferDriver {
 public:
  struct Done {
    Transfer* transfer;
    CURLcode result;
  };

  // `wake_fd`: an eventfd (not owned) that other threads write to end a
  // run_once() wait early; run_once resets it. nullptr and *error set when
  // epoll or the multi handle cannot be made.
  static std::unique_ptr<TransferDriver> create(int wake_fd,
                                                std::string* error);
  ~TransferDriver();
  TransferDriver(const TransferDriver&) = delete;
  TransferDriver& operator=(const TransferDriver&) = delete;

  // At least `count` shards (never fewer than before). Each shard is its own
  // CURLM handle with its own connection cache; see kWorkersPerShard.
  std::string ensure_shards(std::size_t count);
  std::size_t shards() const { return shards_.size(); }
  // Connections kept alive for reuse in all, spread over the shards (one
  // per worker is the aim).
  std::string set_max_connects(long connections);
  // Adds a configured transfer to shard `shard_key % shards()`: the same key
  // for the same worker keeps its kept-alive connection reusable. "" or why
  // curl refused it.
  std::string add(Transfer& t, std::size_t shard_key);
  // Waits at most `max_wait_ms` (less when a curl timer is due sooner) for
  // socket activity, a curl timer or the wake fd; lets curl act; appends the
  // transfers that finished (still attached: the owner detaches them).
  std::string run_once(int max_wait_ms, std::vector<Done>& done);

  int epoll_fd() const { return epoll_.get(); }  // for fault tests

 private:
  using Clock = std::chrono::steady_clock;
  struct Shard {
    TransferDriver* driver = nullptr;
    std::size_t index = 0;
    MultiHandle multi;
    std::optional<Clock::time_point> timer_at;  // when curl wants a timeout
  };

  TransferDriver(UniqueFd epoll, int wake_fd);
  static int on_socket(CURL* easy, curl_socket_t socket, int what, void* user,
                       void* socket_data);
  static int on_timer(CURLM* multi, long timeout_ms, void* user);
  std::string act(Shard& shard, curl_socket_t socket, int events);
  void collect(Shard& shard, std::vector<Done>& done);

  // Declared before the shards: curl_multi_cleanup may still call
  // on_socket (removing cached connections), which needs the epoll set.
  UniqueFd epoll_;
  int wake_fd_;
  long max_connects_ = 0;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::string callback_error_;  // an epoll_ctl failure inside on_socket
};

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_CURL_TRANSFER_H_
