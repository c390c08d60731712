// TransferDriver and the request helpers against loopback servers, and the
// driver's error path with its epoll set taken away.
#include "curl_transfer.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loopback_server.h"

namespace mineru_health::internal {

void ensure_curl_global_init();

namespace {

using test_support::Mode;
using test_support::TestServer;

struct UrlCase {
  const char* base;
  int port;
  std::optional<std::string> want;
};

TEST(HealthUrlTest, MainPortUrl) {
  EXPECT_EQ(main_health_url("http://127.0.0.1:8000"),
            "http://127.0.0.1:8000/health");
  EXPECT_EQ(main_health_url("http://127.0.0.1:8000//"),
            "http://127.0.0.1:8000/health");
}

TEST(HealthUrlTest, NativeUrlTakesOnlyThePortFromTheWorker) {
  ensure_curl_global_init();
  const std::vector<UrlCase> cases = {
      {"http://127.0.0.1:8000", 18000, "http://127.0.0.1:18000/health"},
      {"https://worker-3.example:443/api/?x=1#y", 9,
       "http://worker-3.example:9/health"},
      {"http://user:pw@10.0.0.5:8000", 18000, "http://10.0.0.5:18000/health"},
      {"http://[::1]:8000", 18001, "http://[::1]:18001/health"},
      {"http://127.0.0.1:8000", 0, std::nullopt},
      {"http://127.0.0.1:8000", 65536, std::nullopt},
      {"not a url", 18000, std::nullopt},
      {"", 18000, std::nullopt},
  };
  for (const UrlCase& c : cases) {
    EXPECT_EQ(native_health_url(c.base, c.port), c.want) << c.base;
  }
}

class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ensure_curl_global_init();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ASSERT_GE(wake_fd_, 0);
    std::string why;
    driver_ = TransferDriver::create(wake_fd_, &why);
    ASSERT_TRUE(driver_) << why;
    setup_.connect_timeout_s = 0.2;
  }
  void TearDown() override {
    transfers_.clear();  // before the driver: curl's teardown order
    driver_.reset();
    close(wake_fd_);
  }

  Transfer& start(const std::string& url, double timeout_s) {
    auto t = std::make_unique<Transfer>();
    t->worker_id = "w" + std::to_string(transfers_.size());
    t->easy = pool_.take();
    EXPECT_EQ(
        configure_request(*t, url, ProbeEndpoint::kNative, timeout_s, setup_),
        "");
    EXPECT_EQ(driver_->add(*t, transfers_.size()), "");
    transfers_.push_back(std::move(t));
    return *transfers_.back();
  }

  // Runs the driver until `count` transfers finished (bounded: 10 s).
  std::vector<ProbeResult> finish(std::size_t count) {
    std::vector<ProbeResult> results;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (results.size() < count &&
           std::chrono::steady_clock::now() < deadline) {
      std::vector<TransferDriver::Done> done;
      EXPECT_EQ(driver_->run_once(100, done), "");
      for (const TransferDriver::Done& d : done) {
        results.push_back(finish_transfer(*d.transfer, d.result, expect_));
      }
    }
    return results;
  }

  int wake_fd_ = -1;
  RequestSetup setup_;
  ProbeExpectations expect_;
  EasyPool pool_{8};
  std::unique_ptr<TransferDriver> driver_;
  std::vector<std::unique_ptr<Transfer>> transfers_;
};

TEST_F(DriverTest, HealthyAndHungTransfersFinishWithTheirStatus) {
  TestServer healthy(Mode::kHealthy);
  TestServer hung(Mode::kHang);
  start(healthy.url() + "/health", 0.3);
  start(hung.url() + "/health", 0.3);
  std::vector<ProbeResult> results = finish(2);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].healthy()) << results[0].detail;
  EXPECT_EQ(results[0].endpoint, ProbeEndpoint::kNative);
  EXPECT_EQ(results[0].url, healthy.url() + "/health");
  EXPECT_EQ(results[1].status, ProbeStatus::kTimeout);
}

TEST_F(DriverTest, WakeFdEndsAWaitAndIsReset) {
  const std::uint64_t one = 1;
  ASSERT_EQ(write(wake_fd_, &one, sizeof one),
            static_cast<ssize_t>(sizeof one));
  std::vector<TransferDriver::Done> done;
  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(driver_->run_once(5000, done), "");
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(4));
  std::uint64_t counter = 0;
  EXPECT_LT(read(wake_fd_, &counter, sizeof counter), 0);  // already reset
}

TEST_F(DriverTest, BrokenEpollSetIsAnErrorNotASpin) {
  close(driver_->epoll_fd());
  std::vector<TransferDriver::Done> done;
  const std::string error = driver_->run_once(10, done);
  EXPECT_NE(error.find("epoll_wait"), std::string::npos) << error;
}

TEST(DriverCreateTest, BadWakeFdIsAnError) {
  std::string why;
  EXPECT_FALSE(TransferDriver::create(-1, &why));
  EXPECT_NE(why.find("epoll_ctl"), std::string::npos) << why;
}

TEST(RequestTest, NoEasyHandleIsRefused) {
  Transfer t;
  RequestSetup setup;
  EXPECT_EQ(configure_request(t, "http://127.0.0.1:1/health",
                              ProbeEndpoint::kMain, 1.0, setup),
            "curl_easy_init failed");
}

}  // namespace
}  // namespace mineru_health::internal
