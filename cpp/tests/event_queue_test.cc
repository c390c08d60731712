#include "event_queue.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <string>
#include <thread>
#include <vector>

namespace mineru_health::internal {
namespace {

PollerEvent event(PollerEventKind kind, const std::string& id) {
  PollerEvent e;
  e.kind = kind;
  e.worker_id = id;
  return e;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

TEST(EventQueueTest, FdIsReadableExactlyWhileEventsWait) {
  EventQueue q(10);
  EXPECT_FALSE(readable(q.fd()));
  q.push(event(PollerEventKind::kProbe, "a"));
  q.push(event(PollerEventKind::kAudit, "b"));
  EXPECT_TRUE(readable(q.fd()));
  std::vector<PollerEvent> got = q.drain();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].worker_id, "a");
  EXPECT_EQ(got[1].worker_id, "b");
  EXPECT_FALSE(readable(q.fd()));
  EXPECT_TRUE(q.drain().empty());
}

TEST(EventQueueTest, WhenFullOnlyProbeEventsAreDroppedAndCounted) {
  EventQueue q(2);
  q.push(event(PollerEventKind::kProbe, "p1"));
  q.push(event(PollerEventKind::kProbe, "p2"));
  q.push(event(PollerEventKind::kProbe, "dropped"));
  q.push(event(PollerEventKind::kAudit, "audit"));
  q.push(event(PollerEventKind::kRestartRequested, "restart"));
  q.push(event(PollerEventKind::kError, ""));
  EventQueue::Counts c = q.counts();
  EXPECT_EQ(c.dropped, 1u);
  EXPECT_EQ(c.queued, 5u);
  EXPECT_EQ(c.pushed, 5u);
  std::vector<PollerEvent> got = q.drain();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[2].kind, PollerEventKind::kAudit);
  EXPECT_EQ(got[4].kind, PollerEventKind::kError);
  EXPECT_EQ(q.counts().queued, 0u);
  EXPECT_EQ(q.counts().notify_errors, 0u);
}

TEST(EventQueueTest, ConcurrentPushAndDrainLoseNothing) {
  EventQueue q(1000000);
  constexpr int kPerThread = 5000;
  std::vector<std::thread> producers;
  for (int t = 0; t < 2; ++t) {
    producers.emplace_back([&q] {
      for (int i = 0; i < kPerThread; ++i)
        q.push(event(PollerEventKind::kAudit, "x"));
    });
  }
  std::size_t total = 0;
  for (int i = 0; i < 1000000 && total < 2u * kPerThread; ++i) {
    total += q.drain().size();
  }
  for (std::thread& t : producers) t.join();
  total += q.drain().size();
  EXPECT_EQ(total, 2u * kPerThread);
  EXPECT_FALSE(readable(q.fd()));
}

}  // namespace
}  // namespace mineru_health::internal
