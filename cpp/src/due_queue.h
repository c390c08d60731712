// DueQueue: which keys come due when, earliest first (private to the core
// library). One per kind of deadline in the poller: probes, policy ticks.
//
//   DueQueue<std::string> probes;
//   probes.schedule("w0", now + 2s);     // replaces w0's previous entry
//   for (const std::string& id : probes.pop_due(now, 500)) start(id);
//   int wait_ms = ... probes.next() ...
//
// A key has at most one live entry: scheduling it again replaces it, cancel
// drops it. Replaced entries stay in the heap until they surface (lazy
// deletion) and the heap is rebuilt when they outnumber the live ones, so
// memory stays proportional to the keys. Pure; not thread-safe (the owner
// guards it).
#ifndef MINERU_HEALTH_SRC_DUE_QUEUE_H_
#define MINERU_HEALTH_SRC_DUE_QUEUE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mineru_health/restart_policy.h"

namespace mineru_health::internal {

template <typename Key, typename Hash = std::hash<Key>>
class DueQueue {
 public:
  void schedule(const Key& key, TimePoint at) {
    const std::uint64_t seq = ++seq_;
    live_[key] = Live{seq, at};
    heap_.push_back(Entry{at, seq, key});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
    compact_if_sparse();
  }

  void cancel(const Key& key) {
    live_.erase(key);
    compact_if_sparse();
  }

  bool contains(const Key& key) const { return live_.count(key) != 0; }
  std::optional<TimePoint> due_at(const Key& key) const {
    auto it = live_.find(key);
    if (it == live_.end()) return std::nullopt;
    return it->second.at;
  }
  std::size_t size() const { return live_.size(); }
  bool empty() const { return live_.empty(); }

  // The earliest live due time.
  std::optional<TimePoint> next() {
    drop_stale_top();
    if (heap_.empty()) return std::nullopt;
    return heap_.front().at;
  }

  // Removes and returns up to `limit` keys due at or before `now`, earliest
  // first (ties in scheduling order).
  std::vector<Key> pop_due(TimePoint now, std::size_t limit) {
    std::vector<Key> due;
    while (due.size() < limit) {
      drop_stale_top();
      if (heap_.empty() || heap_.front().at > now) break;
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      Entry entry = std::move(heap_.back());
      heap_.pop_back();
      live_.erase(entry.key);
      due.push_back(std::move(entry.key));
    }
    return due;
  }

 private:
  struct Entry {
    TimePoint at;
    std::uint64_t seq;
    Key key;
  };
  struct Live {
    std::uint64_t seq;
    TimePoint at;
  };
  // std::*_heap keep the "largest" first: order by later time, then later
  // sequence, so the front is the earliest (first scheduled on a tie).
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.at != b.at) return a.at > b.at;
      return a.seq > b.seq;
    }
  };

  bool is_live(const Entry& e) const {
    auto it = live_.find(e.key);
    return it != live_.end() && it->second.seq == e.seq;
  }

  void drop_stale_top() {
    while (!heap_.empty() && !is_live(heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      heap_.pop_back();
    }
  }

  void compact_if_sparse() {
    // Rebuild when stale entries outnumber live ones (plus some slack so a
    // small queue does not rebuild on every call).
    if (heap_.size() <= 2 * live_.size() + 64) return;
    std::vector<Entry> kept;
    kept.reserve(live_.size());
    for (Entry& e : heap_) {
      if (is_live(e)) kept.push_back(std::move(e));
    }
    heap_ = std::move(kept);
    std::make_heap(heap_.begin(), heap_.end(), Later{});
  }

  std::vector<Entry> heap_;
  std::unordered_map<Key, Live, Hash> live_;
  std::uint64_t seq_ = 0;
};

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_DUE_QUEUE_H_
