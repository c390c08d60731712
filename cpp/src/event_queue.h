// EventQueue: the bounded hand-off of poller events to their owner, with an
// eventfd that is readable while events wait (private to the core library).
//
//   EventQueue queue(100000);
//   queue.push(event);                        // any thread
//   // owner: loop.add_reader(queue.fd(), ...) -> queue.drain()
//
// When full, probe events are dropped and counted; audit, restart and error
// events are always kept (they change what the owner must do). Thread-safe:
// push and drain may run on different threads.
#ifndef MINERU_HEALTH_SRC_EVENT_QUEUE_H_
#define MINERU_HEALTH_SRC_EVENT_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "mineru_health/poller.h"
#include "thread_annotations.h"
#include "unique_fd.h"

namespace mineru_health::internal {

class EventQueue {
 public:
  struct Counts {
    std::uint64_t pushed = 0;
    std::uint64_t dropped = 0;        // probe events dropped while full
    std::uint64_t notify_errors = 0;  // eventfd writes that failed
    std::size_t queued = 0;
  };

  // Throws std::runtime_error when no eventfd can be created.
  explicit EventQueue(std::size_t capacity);
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Readable while drain() has something to return.
  int fd() const { return fd_.get(); }
  void push(PollerEvent event) EXCLUDES(mu_);
  std::vector<PollerEvent> drain() EXCLUDES(mu_);
  Counts counts() const EXCLUDES(mu_);

 private:
  const std::size_t capacity_;
  const UniqueFd fd_;
  mutable Mutex mu_;
  std::deque<PollerEvent> events_ GUARDED_BY(mu_);
  Counts counts_ GUARDED_BY(mu_);
};

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_EVENT_QUEUE_H_
