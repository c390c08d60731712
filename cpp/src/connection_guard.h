// ConnectionGuard: decides which open connections of the native health
// endpoint to close so that no client can crowd out the router's probe.
//
//   ConnectionGuard guard({/*total=*/64, /*per_address=*/16, 2s});
//   for (auto id : guard.opened(id, "127.0.0.1", now)) shutdown(fd_of(id));
//   ...
//   guard.closed(id);
//
// Three bounds, checked each time a connection is accepted: no connection
// lives past `deadline` from its acceptance (an absolute bound, unlike an idle
// timer that every trickled byte resets); an address holding more than
// `per_address` connections loses its oldest; past `total` open connections
// the oldest of all goes. Neither of the last two ever closes a connection
// younger than `grace`: one that speaks at once (a probe) is answered within
// it, however many clients came before or after it, while slow ones grow old
// and go first. Pure: the time comes in as an argument.
//
// Thread-safety: none; the health server calls it on its daemon thread only.
#ifndef MINERU_HEALTH_CONNECTION_GUARD_H_
#define MINERU_HEALTH_CONNECTION_GUARD_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mineru_health {

class ConnectionGuard {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = std::uintptr_t;

  struct Limits {
    unsigned total = 64;        // open connections before the oldest is closed
    unsigned per_address = 16;  // per client address; 0: no such bound
    Clock::duration deadline = std::chrono::seconds(2);
    Clock::duration grace = std::chrono::milliseconds(250);
  };

  explicit ConnectionGuard(Limits limits) : limits_(limits) {}

  // A connection from `address` was accepted at `now`; returns the ids of the
  // connections to close now (never `id` itself), each returned only once.
  [[nodiscard]] std::vector<Id> opened(Id id, std::string address,
                                       Clock::time_point now);
  // The connection is gone (whoever closed it).
  void closed(Id id);
  // Connections open and not yet asked to close.
  std::size_t open() const;

 private:
  struct Entry {
    Id id;
    std::string address;
    Clock::time_point since;
    bool closing = false;
  };
  Limits limits_;
  std::vector<Entry> entries_;  // in order of acceptance: oldest first
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CONNECTION_GUARD_H_
