// ConnectionGuard: the bounds are checked in acceptance order, so "the oldest"
// is always the first entry still open.
#include "connection_guard.h"

#include <algorithm>
#include <utility>

namespace mineru_health {

std::vector<ConnectionGuard::Id> ConnectionGuard::opened(
    Id id, std::string address, Clock::time_point now) {
  entries_.push_back(Entry{id, std::move(address), now});
  const Entry& newest = entries_.back();
  std::vector<Id> to_close;
  auto close = [&to_close](Entry& entry) {
    entry.closing = true;
    to_close.push_back(entry.id);
  };
  // Entries before the newest one, oldest first.
  const auto older_end = entries_.end() - 1;
  auto may_close = [&](const Entry& entry) {
    return !entry.closing && now - entry.since >= limits_.grace;
  };

  for (auto it = entries_.begin(); it != older_end; ++it) {
    if (!it->closing && now - it->since >= limits_.deadline) close(*it);
  }
  if (limits_.per_address > 0) {
    std::size_t same = 0;
    for (const Entry& entry : entries_) {
      if (!entry.closing && entry.address == newest.address) ++same;
    }
    for (auto it = entries_.begin();
         it != older_end && same > limits_.per_address; ++it) {
      if (may_close(*it) && it->address == newest.address) {
        close(*it);
        --same;
      }
    }
  }
  std::size_t total = open();
  for (auto it = entries_.begin(); it != older_end && total > limits_.total;
       ++it) {
    if (may_close(*it)) {
      close(*it);
      --total;
    }
  }
  return to_close;
}

void ConnectionGuard::closed(Id id) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [id](const Entry& e) { return e.id == id; }),
                 entries_.end());
}

std::size_t ConnectionGuard::open() const {
  return static_cast<std::size_t>(
      std::count_if(entries_.begin(), entries_.end(),
                    [](const Entry& e) { return !e.closing; }));
}

}  // namespace mineru_health
