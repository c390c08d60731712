// WorkerState tests. Nothing here sleeps to wait for logic: the watchdogs
// run on a fake clock, and waits either time out on a short bound, are
// released by another thread's action, or notice a stall on their own
// periodic check (within a second).
#include "mineru_health/worker_state.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace mineru_health {
namespace {

using std::chrono::milliseconds;

FatalRecord record(const char* error, double when) {
  return FatalRecord{error, "vllm.engine_dead", "engine_dead", when,
                     "vllm.v1.engine.exceptions.EngineDeadError"};
}

// A steady clock that only moves when told, and a fixed wall clock. Atomic
// so that a waiting thread may read it while the test advances it.
class FakeClock {
 public:
  WorkerClock clock() {
    return WorkerClock{[this] {
                         ++reads_;
                         return now_.load();
                       },
                       [] { return 1700000000.0; }};
  }
  void advance(std::chrono::nanoseconds d) { now_.store(now_.load() + d); }
  int reads() const { return reads_.load(); }

 private:
  std::atomic<int> reads_{0};
  std::atomic<SteadyTime> now_{SteadyTime{} + std::chrono::hours(1)};
};

WorkerStateOptions options(int hang_s, int stall_s) {
  WorkerStateOptions o;
  o.loop_hang = std::chrono::seconds(hang_s);
  o.stall = std::chrono::seconds(stall_s);
  return o;
}

ServiceInfo service() { return ServiceInfo{"3.4.4", 2, 3, 64, 86400, 300}; }

TEST(WorkerState, StartsHealthy) {
  WorkerState state;
  EXPECT_TRUE(state.healthy());
  WorkerSnapshot snap = state.snapshot();
  EXPECT_TRUE(snap.healthy);
  EXPECT_EQ(snap.phase, HealthPhase::kStarting);  // no service reported yet
  EXPECT_FALSE(snap.loop_lag_s.has_value());
  EXPECT_FALSE(snap.seconds_since_progress.has_value());
  EXPECT_EQ(snap.fatal_count, 0u);
  EXPECT_EQ(snap.task_local_count, 0u);
  EXPECT_FALSE(snap.first_fatal.has_value());
  EXPECT_FALSE(snap.last_fatal.has_value());
}

TEST(WorkerState, TaskLocalKeepsHealthy) {
  WorkerState state;
  state.record_task_local();
  state.record_task_local();
  EXPECT_TRUE(state.healthy());
  EXPECT_EQ(state.snapshot().task_local_count, 2u);
}

TEST(WorkerState, FirstFatalKeptLastUpdated) {
  WorkerState state;
  state.record_fatal(record("EngineDeadError: first", 100.5));
  EXPECT_FALSE(state.healthy());
  state.record_fatal(record("EngineDeadError: second", 200.0));
  WorkerSnapshot snap = state.snapshot();
  EXPECT_FALSE(snap.healthy);
  EXPECT_EQ(snap.fatal_count, 2u);
  ASSERT_TRUE(snap.first_fatal.has_value());
  ASSERT_TRUE(snap.last_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->error, "EngineDeadError: first");
  EXPECT_DOUBLE_EQ(snap.first_fatal->unix_time, 100.5);
  EXPECT_EQ(snap.first_fatal->rule, "vllm.engine_dead");
  EXPECT_EQ(snap.first_fatal->category, "engine_dead");
  EXPECT_EQ(snap.last_fatal->error, "EngineDeadError: second");
}

TEST(FatalRecord, SinceAndCause) {
  FatalRecord fatal = record("EngineDeadError: x", 1700000000.0);
  EXPECT_EQ(fatal.since(), "2023-11-14T22:13:20.000000+00:00");
  fatal.unix_time = 1700000000.25;
  EXPECT_EQ(fatal.since(), "2023-11-14T22:13:20.250000+00:00");
  EXPECT_EQ(fatal.cause(), "engine_dead, rule vllm.engine_dead");
}

TEST(WorkerState, ResetClearsEverything) {
  WorkerState state;
  state.record_task_local();
  state.record_fatal(record("x", 1));
  state.reset();
  WorkerSnapshot snap = state.snapshot();
  EXPECT_TRUE(snap.healthy);
  EXPECT_EQ(snap.fatal_count, 0u);
  EXPECT_EQ(snap.task_local_count, 0u);
  EXPECT_TRUE(snap.fatal_counts.empty());
  EXPECT_FALSE(snap.first_fatal.has_value());
  // A new fatal after reset is the new first one.
  state.record_fatal(record("y", 2));
  EXPECT_EQ(state.snapshot().first_fatal->error, "y");
}

TEST(WorkerState, CountsFatalRecordsByRuleWhoeverRecordsThem) {
  FakeClock fake;
  WorkerState state(options(60, 5), fake.clock());
  state.record_task_local();
  state.record_task_local(/*remote_engine=*/true);
  state.record_storage_full();
  state.record_fatal(record("x", 1));
  state.record_fatal(record("y", 2));
  state.record_fatal(FatalRecord{"z", "liveness", "engine_dead", 3, ""});
  WorkerSnapshot snap = state.snapshot();
  EXPECT_EQ(snap.task_local_count, 2u);
  EXPECT_EQ(snap.remote_engine_failure_count, 1u);
  EXPECT_EQ(snap.storage_full_count, 1u);
  ASSERT_EQ(snap.fatal_counts.size(), 2u);  // by rule, then category
  EXPECT_EQ(snap.fatal_counts[0].rule, "liveness");
  EXPECT_EQ(snap.fatal_counts[0].count, 1u);
  EXPECT_EQ(snap.fatal_counts[1].rule, "vllm.engine_dead");
  EXPECT_EQ(snap.fatal_counts[1].category, "engine_dead");
  EXPECT_EQ(snap.fatal_counts[1].count, 2u);

  // The watchdogs' own records count too (a stall here).
  WorkerState stalled(options(60, 5), fake.clock());
  stalled.engine_call_started();
  fake.advance(std::chrono::seconds(6));
  snap = stalled.snapshot();
  ASSERT_EQ(snap.fatal_counts.size(), 1u);
  EXPECT_EQ(snap.fatal_counts[0].rule, kStallRule);
  EXPECT_EQ(snap.fatal_counts[0].category, kStallCategory);
}

TEST(WorkerState, WaitTimesOutWhileHealthy) {
  WorkerState state;
  EXPECT_FALSE(state.wait_until_unhealthy(milliseconds(0)));
  EXPECT_FALSE(state.wait_until_unhealthy(milliseconds(-5)));
  EXPECT_FALSE(state.wait_until_unhealthy(milliseconds(20)));
}

TEST(WorkerState, WaitReturnsAtOnceWhenAlreadyUnhealthy) {
  WorkerState state;
  state.record_fatal(record("x", 1));
  EXPECT_TRUE(state.wait_until_unhealthy(milliseconds(0)));
  // A bound far beyond the test's run time: returning proves no wait.
  EXPECT_TRUE(state.wait_until_unhealthy(std::chrono::hours(1)));
  EXPECT_TRUE(state.wait_until_unhealthy(milliseconds::max()));
}

TEST(WorkerState, WaitersWokenByFatalFromAnotherThread) {
  WorkerState state;
  constexpr int kWaiters = 4;
  std::atomic<int> started{0};
  std::vector<std::future<bool>> results;
  for (int i = 0; i < kWaiters; ++i) {
    results.push_back(std::async(std::launch::async, [&state, &started, i] {
      ++started;
      // One waiter uses the largest timeout to exercise the overflow guard.
      return state.wait_until_unhealthy(i == 0 ? milliseconds::max()
                                               : std::chrono::hours(1));
    }));
  }
  // Whether the waiters are already blocked or not, the predicate makes the
  // outcome the same; spin briefly (bounded) so most are truly waiting.
  for (int spins = 0; started.load() < kWaiters && spins < 1000000; ++spins) {
    std::this_thread::yield();
  }
  state.record_fatal(record("EngineDeadError", 3));
  for (auto& result : results) {
    ASSERT_EQ(result.wait_for(std::chrono::seconds(30)),
              std::future_status::ready);
    EXPECT_TRUE(result.get());
  }
}

TEST(WorkerState, ConcurrentRecordsAreCounted) {
  WorkerState state;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> unhealthy_seen_early{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&state, &unhealthy_seen_early, t] {
      for (int i = 0; i < kPerThread; ++i) {
        state.record_task_local();
        if (i % 100 == 0) {
          state.record_fatal(record("x", t * 10000.0 + i));
        }
        WorkerSnapshot snap = state.snapshot();
        if (snap.fatal_count > 0 && snap.healthy) ++unhealthy_seen_early;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  WorkerSnapshot snap = state.snapshot();
  EXPECT_EQ(snap.task_local_count,
            static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(snap.fatal_count,
            static_cast<std::uint64_t>(kThreads * (kPerThread / 100)));
  EXPECT_FALSE(snap.healthy);
  EXPECT_EQ(unhealthy_seen_early.load(), 0);  // snapshots are consistent
  ASSERT_TRUE(snap.first_fatal.has_value());
  ASSERT_TRUE(snap.last_fatal.has_value());
}

TEST(WorkerState, PhaseFollowsServiceManagerAndFatal) {
  FakeClock fake;
  WorkerState state(options(60, 300), fake.clock());
  EXPECT_EQ(state.snapshot().phase, HealthPhase::kStarting);
  state.set_service(service());
  EXPECT_EQ(state.snapshot().phase, HealthPhase::kHealthy);
  state.set_tasks({1, 0, 5, 2}, "Task dispatcher is not running");
  WorkerSnapshot snap = state.snapshot();
  EXPECT_EQ(snap.phase, HealthPhase::kUnhealthy);
  EXPECT_EQ(snap.tasks.completed, 5);
  EXPECT_EQ(snap.manager_error, "Task dispatcher is not running");
  state.set_tasks({1, 0, 5, 2}, "");
  EXPECT_EQ(state.snapshot().phase, HealthPhase::kHealthy);
  EXPECT_TRUE(state.record_fatal(record("EngineDeadError", 1)));
  EXPECT_FALSE(state.record_fatal(record("again", 2)));  // not the first
  EXPECT_EQ(state.snapshot().phase, HealthPhase::kFatal);
}

TEST(WorkerState, LoopLagIsBusyUntilTheHangLimit) {
  FakeClock fake;
  WorkerState state(options(60, 300), fake.clock());
  state.set_service(service());
  state.loop_tick();
  fake.advance(std::chrono::milliseconds(250));
  WorkerSnapshot snap = state.snapshot();
  ASSERT_TRUE(snap.loop_lag_s.has_value());
  EXPECT_DOUBLE_EQ(*snap.loop_lag_s, 0.25);
  EXPECT_EQ(snap.phase, HealthPhase::kHealthy);

  // Blocked for the whole limit: still busy, not hung.
  fake.advance(std::chrono::seconds(60) - std::chrono::milliseconds(250));
  snap = state.snapshot();
  EXPECT_FALSE(snap.loop_hung);
  EXPECT_EQ(snap.phase, HealthPhase::kHealthy);

  fake.advance(std::chrono::milliseconds(1));
  snap = state.snapshot();
  EXPECT_TRUE(snap.loop_hung);
  EXPECT_EQ(snap.phase, HealthPhase::kLoopHung);
  EXPECT_TRUE(snap.healthy);  // a hung loop records nothing: it may resume

  state.loop_tick();
  snap = state.snapshot();
  EXPECT_FALSE(snap.loop_hung);
  EXPECT_EQ(snap.phase, HealthPhase::kHealthy);
}

TEST(WorkerState, StallNeedsEngineCallsInFlightAndNoProgress) {
  FakeClock fake;
  WorkerState state(options(60, 300), fake.clock());
  state.set_service(service());
  // Idle for an hour: an idle worker is never stalled.
  fake.advance(std::chrono::hours(1));
  EXPECT_EQ(state.snapshot().phase, HealthPhase::kHealthy);
  EXPECT_FALSE(state.snapshot().seconds_since_progress.has_value());

  // A task preparing its pages is not an engine call: never a stall.
  state.set_tasks({0, 1, 0, 0}, "");
  fake.advance(std::chrono::hours(1));
  EXPECT_TRUE(state.snapshot().healthy);
  EXPECT_FALSE(state.snapshot().seconds_since_progress.has_value());

  // An engine call begins now: the idle hours do not count against it.
  state.engine_call_started();
  fake.advance(std::chrono::seconds(200));
  state.progress();  // one request answered
  fake.advance(std::chrono::seconds(299));
  WorkerSnapshot snap = state.snapshot();
  ASSERT_TRUE(snap.seconds_since_progress.has_value());
  EXPECT_DOUBLE_EQ(*snap.seconds_since_progress, 299.0);
  EXPECT_EQ(snap.engine_calls_in_flight, 1);
  EXPECT_TRUE(snap.healthy);

  fake.advance(std::chrono::seconds(2));
  snap = state.snapshot();
  EXPECT_FALSE(snap.healthy);
  EXPECT_EQ(snap.phase, HealthPhase::kFatal);
  ASSERT_TRUE(snap.first_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->category, kStallCategory);
  EXPECT_EQ(snap.first_fatal->rule, kStallRule);
  EXPECT_DOUBLE_EQ(snap.first_fatal->unix_time, 1700000000.0);
  EXPECT_TRUE(state.wait_until_unhealthy(milliseconds(0)));
  // Evaluated again: recorded once.
  EXPECT_EQ(state.snapshot().fatal_count, 1u);
}

TEST(WorkerState, HealthySeesAStallWithoutASnapshot) {
  FakeClock fake;
  WorkerState state(options(60, 10), fake.clock());
  state.engine_call_started();
  fake.advance(std::chrono::seconds(11));
  EXPECT_FALSE(state.healthy());
  WorkerSnapshot snap = state.snapshot();
  EXPECT_EQ(snap.fatal_count, 1u);
  ASSERT_TRUE(snap.first_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->category, kStallCategory);
}

TEST(WorkerState, WaitSeesAStallWithoutASnapshot) {
  FakeClock fake;
  WorkerState state(options(60, 10), fake.clock());
  state.engine_call_started();
  fake.advance(std::chrono::seconds(11));
  // A bound far beyond the test's run time: returning proves no wait.
  EXPECT_TRUE(state.wait_until_unhealthy(std::chrono::hours(1)));
  EXPECT_EQ(state.snapshot().first_fatal->category, kStallCategory);
}

TEST(WorkerState, WaiterNoticesAStallThatNobodyProbes) {
  FakeClock fake;
  WorkerState state(options(60, 10), fake.clock());
  state.engine_call_started();
  const int reads_before = fake.reads();
  std::future<bool> waiter = std::async(std::launch::async, [&state] {
    return state.wait_until_unhealthy(std::chrono::hours(1));
  });
  // Advance only after the waiter's first look at the clock, so that its
  // periodic check finds the stall, not its check on entry; nothing else
  // calls into the state from here on.
  while (fake.reads() == reads_before) std::this_thread::yield();
  fake.advance(std::chrono::seconds(11));
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  EXPECT_TRUE(waiter.get());
  EXPECT_EQ(state.snapshot().first_fatal->category, kStallCategory);
}

TEST(WorkerState, EngineCallsAloneCountAsWork) {
  FakeClock fake;
  WorkerState state(options(60, 10), fake.clock());
  state.set_service(service());
  state.engine_call_started();
  state.engine_call_started();
  fake.advance(std::chrono::seconds(8));
  state.engine_call_finished();  // progress, one still in flight
  fake.advance(std::chrono::seconds(8));
  EXPECT_TRUE(state.snapshot().healthy);
  state.engine_call_finished();
  fake.advance(std::chrono::hours(1));  // idle again
  WorkerSnapshot snap = state.snapshot();
  EXPECT_TRUE(snap.healthy);
  EXPECT_EQ(snap.engine_calls_in_flight, 0);
  // An unmatched finish never goes negative.
  state.engine_call_finished();
  EXPECT_EQ(state.snapshot().engine_calls_in_flight, 0);
}

TEST(WorkerState, ZeroStallDisablesTheWatchdog) {
  FakeClock fake;
  WorkerState state(options(60, 0), fake.clock());
  state.set_service(service());
  state.engine_call_started();
  fake.advance(std::chrono::hours(24));
  EXPECT_TRUE(state.snapshot().healthy);
}

TEST(WorkerState, AmbiguousErrorsEscalateWithinTheWindow) {
  FakeClock fake;
  WorkerStateOptions o = options(60, 300);
  o.error_budget = 3;
  o.error_budget_window = std::chrono::seconds(60);
  WorkerState state(o, fake.clock());
  const FatalRecord oom{"OutOfMemoryError: CUDA out of memory", "cuda.oom",
                        "cuda_oom", 5, "torch.OutOfMemoryError"};
  EXPECT_FALSE(state.record_ambiguous(oom));
  fake.advance(std::chrono::seconds(50));
  EXPECT_FALSE(state.record_ambiguous(oom));
  fake.advance(std::chrono::seconds(20));  // the first one left the window
  EXPECT_FALSE(state.record_ambiguous(oom));
  EXPECT_TRUE(state.healthy());
  fake.advance(std::chrono::seconds(5));
  EXPECT_TRUE(state.record_ambiguous(oom));  // three within 60 s
  WorkerSnapshot snap = state.snapshot();
  EXPECT_FALSE(snap.healthy);
  EXPECT_EQ(snap.ambiguous_count, 4u);
  ASSERT_TRUE(snap.first_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->category, kBudgetCategory);
  EXPECT_EQ(snap.first_fatal->exception_type, "torch.OutOfMemoryError");
  EXPECT_NE(snap.first_fatal->error.find("CUDA out of memory"),
            std::string::npos);
  EXPECT_FALSE(state.record_ambiguous(oom));  // already fatal
}

TEST(WorkerState, ZeroBudgetNeverEscalates) {
  FakeClock fake;
  WorkerStateOptions o = options(60, 300);
  o.error_budget = 0;
  WorkerState state(o, fake.clock());
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(state.record_ambiguous({}));
  EXPECT_TRUE(state.healthy());
}

TEST(WorkerState, TicksFromManyThreadsWhileReading) {
  WorkerState state;
  state.set_service(service());
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    for (int i = 0; i < 20000 && !stop.load(); ++i) state.loop_tick();
  });
  for (int i = 0; i < 2000; ++i) {
    WorkerSnapshot snap = state.snapshot();
    if (snap.loop_lag_s) {
      EXPECT_GE(*snap.loop_lag_s, 0.0);
    }
  }
  stop = true;
  ticker.join();
}

TEST(HealthPhase, Names) {
  EXPECT_STREQ(to_string(HealthPhase::kStarting), "starting");
  EXPECT_STREQ(to_string(HealthPhase::kHealthy), "healthy");
  EXPECT_STREQ(to_string(HealthPhase::kUnhealthy), "unhealthy");
  EXPECT_STREQ(to_string(HealthPhase::kLoopHung), "loop_hung");
  EXPECT_STREQ(to_string(HealthPhase::kFatal), "fatal");
}

// Options whose task watchdog calls a task hung after `seconds` of silence.
WorkerStateOptions hang_options(int seconds) {
  WorkerStateOptions o = options(60, 300);
  o.task_hang = std::chrono::seconds(seconds);
  return o;
}

TEST(WorkerState, TaskWatchdogFailsHungTasksOnceAndStallsWhenAllAreHung) {
  FakeClock fake;
  WorkerState state(hang_options(900), fake.clock());
  state.task_started("a");
  state.task_started("b");
  fake.advance(std::chrono::seconds(600));
  state.task_progress("b");        // b's own progress; a has none
  state.task_progress("unknown");  // a task not tracked: ignored
  EXPECT_TRUE(state.take_hung_tasks().empty());
  fake.advance(std::chrono::seconds(301));
  EXPECT_EQ(state.take_hung_tasks(), std::vector<std::string>{"a"});
  EXPECT_TRUE(state.take_hung_tasks().empty());  // reported once
  EXPECT_TRUE(state.healthy());                  // b still progresses
  // b goes quiet too: every task is hung, the worker is stalled.
  fake.advance(std::chrono::seconds(900));
  EXPECT_EQ(state.take_hung_tasks(), std::vector<std::string>{"b"});
  WorkerSnapshot snap = state.snapshot();
  EXPECT_FALSE(snap.healthy);
  ASSERT_TRUE(snap.first_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->rule, kTasksHungRule);
  EXPECT_EQ(snap.first_fatal->category, kStallCategory);
}

TEST(WorkerState, TaskWaitingOnARemoteEngineIsNeverHung) {
  FakeClock fake;
  WorkerState state(hang_options(10), fake.clock());
  state.task_started("remote");
  state.remote_wait_started("remote");
  state.remote_wait_started("remote");  // nested: a request inside a call
  fake.advance(std::chrono::hours(1));
  EXPECT_TRUE(state.take_hung_tasks().empty());
  EXPECT_TRUE(state.healthy());
  state.remote_wait_finished("remote");
  fake.advance(std::chrono::seconds(11));
  EXPECT_TRUE(state.take_hung_tasks().empty());  // still in the outer wait
  state.remote_wait_finished("remote");          // its end is progress
  fake.advance(std::chrono::seconds(9));
  EXPECT_TRUE(state.take_hung_tasks().empty());
  // Out of the wait, the task's own silence counts again.
  fake.advance(std::chrono::seconds(2));
  EXPECT_EQ(state.take_hung_tasks(), std::vector<std::string>{"remote"});
}

TEST(WorkerState, ATaskWaitingOnARemoteEngineIsNotEveryTaskHung) {
  FakeClock fake;
  WorkerState state(hang_options(10), fake.clock());
  state.task_started("remote");
  state.remote_wait_started("remote");
  state.remote_wait_finished("unknown");  // a task not tracked: ignored
  fake.advance(std::chrono::seconds(11));
  EXPECT_TRUE(state.take_hung_tasks().empty());
  EXPECT_TRUE(state.healthy());  // only remote waits: never stalled
  state.task_started("local");
  fake.advance(std::chrono::seconds(11));
  EXPECT_EQ(state.take_hung_tasks(), std::vector<std::string>{"local"});
  EXPECT_TRUE(state.healthy());  // failed alone: the remote task may yet end
  state.remote_wait_finished("remote");
  fake.advance(std::chrono::seconds(11));
  EXPECT_EQ(state.take_hung_tasks(), std::vector<std::string>{"remote"});
  WorkerSnapshot snap = state.snapshot();
  EXPECT_FALSE(snap.healthy);
  ASSERT_TRUE(snap.first_fatal.has_value());
  EXPECT_EQ(snap.first_fatal->rule, kTasksHungRule);
}

// Options whose remote waits fail after `silent` s of silence or `total` s.
WorkerStateOptions remote_options(int silent, int total) {
  WorkerStateOptions o = hang_options(silent);
  o.remote_wait = std::chrono::seconds(total);
  return o;
}

TEST(WorkerState, ARemoteServerThatSendsNothingFailsItsTaskAlone) {
  FakeClock fake;
  WorkerState state(remote_options(3, 8), fake.clock());
  state.task_started("silent");
  state.task_started("local");
  state.remote_wait_started("silent", "10.0.0.7:8000");
  // Waiting for a lock before its first request: no silence yet.
  fake.advance(std::chrono::seconds(4));
  std::optional<RemoteWaitStatus> now = state.remote_wait_status("silent");
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->reason, "");
  EXPECT_DOUBLE_EQ(now->silent_s, 0.0);
  EXPECT_DOUBLE_EQ(*now->left_s, 4.0);  // the total bound only
  state.remote_asked("silent");
  fake.advance(std::chrono::seconds(2));
  state.task_progress("local");
  now = state.remote_wait_status("silent");
  EXPECT_EQ(now->reason, "");
  EXPECT_DOUBLE_EQ(now->silent_s, 2.0);
  ASSERT_TRUE(now->left_s.has_value());
  EXPECT_DOUBLE_EQ(*now->left_s, 1.0);  // the nearer bound: silence
  EXPECT_TRUE(state.take_expired_remote_waits().empty());
  fake.advance(std::chrono::milliseconds(1001));
  state.task_progress("local");
  const std::vector<RemoteWaitStatus> expired =
      state.take_expired_remote_waits();
  ASSERT_EQ(expired.size(), 1U);
  EXPECT_EQ(expired[0].task_id, "silent");
  EXPECT_EQ(expired[0].server, "10.0.0.7:8000");
  EXPECT_EQ(expired[0].reason, kRemoteSilent);
  EXPECT_TRUE(state.take_expired_remote_waits().empty());  // reported once
  EXPECT_TRUE(state.take_hung_tasks().empty());  // never hung, nor the worker
  WorkerSnapshot snap = state.snapshot();
  EXPECT_TRUE(snap.healthy);
  EXPECT_EQ(snap.fatal_count, 0U);
  EXPECT_EQ(snap.remote_silent_count, 1U);
  EXPECT_EQ(snap.remote_too_long_count, 0U);
  EXPECT_EQ(snap.task_local_count, 1U);
  EXPECT_EQ(snap.remote_engine_failure_count, 1U);
  EXPECT_EQ(snap.remote_waits, 1);
}

TEST(WorkerState, ARemoteServerThatTricklesFailsItsTaskAtTheTotalBound) {
  FakeClock fake;
  WorkerState state(remote_options(3, 8), fake.clock());
  state.task_started("trickle");
  state.remote_wait_started("trickle");
  state.remote_wait_started("trickle", "10.0.0.9:80");  // nested: named later
  for (int second = 2; second <= 8; second += 2) {
    fake.advance(std::chrono::seconds(2));
    state.remote_heard("trickle");  // a byte every 2 s: never silent
    EXPECT_TRUE(state.take_expired_remote_waits().empty()) << second;
  }
  fake.advance(std::chrono::milliseconds(1));
  const std::vector<RemoteWaitStatus> expired =
      state.take_expired_remote_waits();
  ASSERT_EQ(expired.size(), 1U);
  EXPECT_EQ(expired[0].reason, kRemoteTooLong);
  EXPECT_EQ(expired[0].server, "10.0.0.9:80");
  EXPECT_NEAR(expired[0].waited_s, 8.001, 1e-9);
  EXPECT_LT(*expired[0].left_s, 0.0);
  EXPECT_EQ(state.snapshot().remote_too_long_count, 1U);
  EXPECT_TRUE(state.healthy());
  // Asked by the task's own I/O, an expired wait is reported there, once.
  state.task_started("other");
  state.remote_wait_started("other");
  state.remote_asked("other");
  fake.advance(std::chrono::seconds(4));
  EXPECT_EQ(state.remote_wait_status("other")->reason, kRemoteSilent);
  EXPECT_EQ(state.remote_wait_status("other")->reason, kRemoteSilent);
  EXPECT_TRUE(state.take_expired_remote_waits().empty());
  EXPECT_EQ(state.snapshot().remote_silent_count, 1U);
}

TEST(WorkerState, EachRemoteWaitHasItsOwnBoundsAndTheyCanBeOff) {
  FakeClock fake;
  WorkerState state(remote_options(3, 8), fake.clock());
  state.task_started("a");
  state.remote_heard("a");  // outside a remote wait: ignored
  EXPECT_FALSE(state.remote_wait_status("a").has_value());
  state.remote_wait_started("a");
  fake.advance(std::chrono::seconds(2));
  state.remote_wait_finished("a");  // the wait ended in time
  fake.advance(std::chrono::seconds(2));
  state.remote_wait_started("a");  // a new wait: new clocks
  fake.advance(std::chrono::seconds(2));
  EXPECT_TRUE(state.take_expired_remote_waits().empty());
  state.task_finished("a");
  fake.advance(std::chrono::hours(1));
  EXPECT_TRUE(state.take_expired_remote_waits().empty());  // forgotten

  WorkerStateOptions off = remote_options(0, 0);
  WorkerState unbounded(off, fake.clock());
  unbounded.task_started("b");
  unbounded.remote_wait_started("b");
  fake.advance(std::chrono::hours(24));
  EXPECT_TRUE(unbounded.take_expired_remote_waits().empty());
  EXPECT_FALSE(unbounded.remote_wait_status("b")->left_s.has_value());
}

TEST(WorkerState, TaskWatchdogForgetsFinishedTasksAndCanBeOff) {
  FakeClock fake;
  WorkerState state(hang_options(10), fake.clock());
  state.task_started("a");
  state.task_finished("a");
  fake.advance(std::chrono::seconds(11));
  EXPECT_TRUE(state.take_hung_tasks().empty());
  EXPECT_TRUE(state.healthy());

  WorkerState off(hang_options(0), fake.clock());
  off.task_started("a");
  fake.advance(std::chrono::hours(24));
  EXPECT_TRUE(off.take_hung_tasks().empty());
  EXPECT_TRUE(off.healthy());
}

}  // namespace
}  // namespace mineru_health
