// The poller's event hand-off: a deque under its own mutex (so the owner's
// drain never waits behind the poller's policy work) and an eventfd.
#include "event_queue.h"

#include <unistd.h>

#include <cerrno>
#include <iterator>
#include <utility>

namespace mineru_health::internal {

EventQueue::EventQueue(std::size_t capacity)
    : capacity_(capacity), fd_(make_eventfd()) {}

void EventQueue::push(PollerEvent event) {
  MutexLock lock(mu_);
  if (events_.size() >= capacity_ && event.kind == PollerEventKind::kProbe) {
    ++counts_.dropped;
    return;
  }
  const bool was_empty = events_.empty();
  events_.push_back(std::move(event));
  ++counts_.pushed;
  if (was_empty) {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is already non-zero: readable either way.
    if (write(fd_.get(), &one, sizeof one) < 0 && errno != EAGAIN) {
      ++counts_.notify_errors;
    }
  }
}

std::vector<PollerEvent> EventQueue::drain() {
  MutexLock lock(mu_);
  // Reset the eventfd under the lock: a producer that finds the queue empty
  // after this point writes it again, so no wake-up is lost. EAGAIN: it was
  // not readable (nothing queued since the last drain).
  std::uint64_t counter = 0;
  if (read(fd_.get(), &counter, sizeof counter) < 0 && errno != EAGAIN) {
    ++counts_.notify_errors;
  }
  std::vector<PollerEvent> out(std::make_move_iterator(events_.begin()),
                               std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

EventQueue::Counts EventQueue::counts() const {
  MutexLock lock(mu_);
  Counts c = counts_;
  c.queued = events_.size();
  return c;
}

}  // namespace mineru_health::internal
