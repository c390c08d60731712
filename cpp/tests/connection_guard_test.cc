// ConnectionGuard: the three bounds on a fake clock, newest never closed.
#include "connection_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace mineru_health {
namespace {

using namespace std::chrono_literals;
using Ids = std::vector<ConnectionGuard::Id>;

const ConnectionGuard::Clock::time_point t0{};

TEST(ConnectionGuard, UnderTheBoundsNothingCloses) {
  ConnectionGuard guard({4, 2, 2s, 0ms});
  EXPECT_EQ(guard.opened(1, "a", t0), Ids{});
  EXPECT_EQ(guard.opened(2, "a", t0 + 1ms), Ids{});
  EXPECT_EQ(guard.opened(3, "b", t0 + 2ms), Ids{});
  EXPECT_EQ(guard.open(), 3u);
}

TEST(ConnectionGuard, AnAddressOverItsShareLosesItsOwnOldest) {
  ConnectionGuard guard({100, 2, 60s, 0ms});
  EXPECT_EQ(guard.opened(1, "b", t0), Ids{});
  EXPECT_EQ(guard.opened(2, "a", t0 + 1ms), Ids{});
  EXPECT_EQ(guard.opened(3, "a", t0 + 2ms), Ids{});
  EXPECT_EQ(guard.opened(4, "a", t0 + 3ms),
            Ids{2});  // not b's, not the new one
  EXPECT_EQ(guard.opened(5, "a", t0 + 4ms), Ids{3});
  EXPECT_EQ(guard.open(), 3u);
}

TEST(ConnectionGuard, PastTheTotalTheOldestOfAllGoes) {
  ConnectionGuard guard({3, 0, 60s, 0ms});
  for (ConnectionGuard::Id id = 1; id <= 3; ++id) {
    EXPECT_EQ(guard.opened(id, "a", t0 + id * 1ms), Ids{});
  }
  EXPECT_EQ(guard.opened(4, "b", t0 + 4ms), Ids{1});
  guard.closed(1);
  EXPECT_EQ(guard.opened(5, "c", t0 + 5ms), Ids{2});
  EXPECT_EQ(guard.open(), 3u);
}

TEST(ConnectionGuard, DeadlineIsAbsoluteFromAcceptance) {
  ConnectionGuard guard({100, 0, 2s, 0ms});
  EXPECT_EQ(guard.opened(1, "a", t0), Ids{});
  EXPECT_EQ(guard.opened(2, "a", t0 + 1s), Ids{});
  // Whatever 1 did meanwhile (a trickled byte a second), at 2 s it goes.
  EXPECT_EQ(guard.opened(3, "b", t0 + 2s), Ids{1});
  EXPECT_EQ(guard.opened(4, "b", t0 + 2500ms), Ids{});  // 1 is not closed twice
  EXPECT_EQ(guard.opened(5, "b", t0 + 3s), Ids{2});
}

TEST(ConnectionGuard, AFloodOfSlowClientsNeverClosesTheNewest) {
  ConnectionGuard guard({8, 4, 2s, 0ms});
  Ids closed;
  for (ConnectionGuard::Id id = 1; id <= 1000; ++id) {
    for (auto gone : guard.opened(id, "attacker", t0 + id * 1ms)) {
      EXPECT_NE(gone, id);
      closed.push_back(gone);
      guard.closed(gone);
    }
  }
  EXPECT_EQ(closed.size(), 996u);
  // The probe, from the same address, is kept; the attacker's oldest goes.
  EXPECT_EQ(guard.opened(5000, "attacker", t0 + 1001ms), Ids{997});
  EXPECT_LE(guard.open(), 4u);
}

}  // namespace
}  // namespace mineru_health

namespace mineru_health {
namespace {

TEST(ConnectionGuard, NothingYoungerThanTheGraceIsClosedForTheBounds) {
  ConnectionGuard guard({2, 1, 2s, 250ms});
  // A burst from one address: all young, none closed, however many.
  EXPECT_EQ(guard.opened(1, "a", t0), Ids{});
  EXPECT_EQ(guard.opened(2, "a", t0 + 1ms), Ids{});
  EXPECT_EQ(guard.opened(3, "a", t0 + 2ms), Ids{});
  // Once the first ones are past the grace, the bounds apply to them.
  EXPECT_EQ(guard.opened(4, "a", t0 + 251ms), Ids({1, 2}));
  EXPECT_EQ(guard.open(), 2u);
}

}  // namespace
}  // namespace mineru_health
