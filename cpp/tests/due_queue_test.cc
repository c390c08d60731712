#include "due_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace mineru_health::internal {
namespace {

using std::chrono::seconds;
using Keys = std::vector<std::string>;

const TimePoint kT0 = TimePoint{} + std::chrono::hours(1);

TEST(DueQueueTest, PopsDueKeysEarliestFirstUpToTheLimit) {
  DueQueue<std::string> q;
  q.schedule("c", kT0 + seconds(3));
  q.schedule("a", kT0 + seconds(1));
  q.schedule("b", kT0 + seconds(2));
  q.schedule("later", kT0 + seconds(10));
  EXPECT_EQ(q.next(), kT0 + seconds(1));
  EXPECT_EQ(q.pop_due(kT0, 10), Keys{});
  EXPECT_EQ(q.pop_due(kT0 + seconds(3), 2), (Keys{"a", "b"}));
  EXPECT_EQ(q.pop_due(kT0 + seconds(3), 2), (Keys{"c"}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.next(), kT0 + seconds(10));
}

TEST(DueQueueTest, TiesComeOutInSchedulingOrder) {
  DueQueue<std::string> q;
  for (const char* k : {"x", "y", "z"}) q.schedule(k, kT0);
  EXPECT_EQ(q.pop_due(kT0, 10), (Keys{"x", "y", "z"}));
}

TEST(DueQueueTest, RescheduleReplacesAndCancelDrops) {
  DueQueue<std::string> q;
  q.schedule("w", kT0 + seconds(1));
  q.schedule("w", kT0 + seconds(5));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.due_at("w"), kT0 + seconds(5));
  EXPECT_EQ(q.pop_due(kT0 + seconds(2), 10), Keys{});  // old entry is stale
  EXPECT_EQ(q.next(), kT0 + seconds(5));
  q.cancel("w");
  EXPECT_FALSE(q.contains("w"));
  EXPECT_FALSE(q.next().has_value());
  EXPECT_EQ(q.pop_due(kT0 + seconds(9), 10), Keys{});
  q.cancel("never");  // harmless
}

TEST(DueQueueTest, ManyReschedulesKeepMemoryBounded) {
  DueQueue<std::string> q;
  for (int i = 0; i < 100000; ++i) {
    q.schedule("w" + std::to_string(i % 10), kT0 + seconds(i));
  }
  EXPECT_EQ(q.size(), 10u);
  // Only the live entries come out, each once.
  Keys due = q.pop_due(kT0 + seconds(200000), 100);
  EXPECT_EQ(due.size(), 10u);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace mineru_health::internal
