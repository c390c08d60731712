// resolver.h against a real DNS server: dnsmasq (Debian's dnsmasq-base) on
// 127.0.0.1:<free port>, its hosts file rewritten and re-read (SIGHUP) as a
// Kubernetes headless Service's endpoints change.
#include "mineru_health/resolver.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mineru_health {
namespace {

// A port no one listens on now (UDP and TCP), for dnsmasq or for a dead server.
int free_port() {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return 0;
  }
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

std::string find_dnsmasq() {
  for (const char* path :
       {"/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// dnsmasq answering for *.test from `hosts` only; ended (SIGTERM, reaped) with
// the test.
class Dnsmasq {
 public:
  explicit Dnsmasq(const std::string& hosts_text) {
    char dir_template[] = "/tmp/mh-resolver-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = dir_template;
    chmod(dir_.c_str(), 0755);  // dnsmasq drops root privileges to read it
    hosts_ = dir_ + "/hosts";
    write(hosts_text);
    port_ = free_port();
    const std::string binary = find_dnsmasq();
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port = "--port=" + std::to_string(port_);
      const std::string hosts = "--addn-hosts=" + hosts_;
      execl(binary.c_str(), "dnsmasq", "--keep-in-foreground", "--no-resolv",
            "--no-hosts", "--conf-file=/dev/null", hosts.c_str(),
            "--listen-address=127.0.0.1", "--bind-interfaces", port.c_str(),
            "--pid-file=", "--local=/test/", "--log-facility=/dev/null",
            static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Dnsmasq() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    unlink(hosts_.c_str());
    rmdir(dir_.c_str());
  }
  Dnsmasq(const Dnsmasq&) = delete;
  Dnsmasq& operator=(const Dnsmasq&) = delete;

  void write(const std::string& text) const { std::ofstream(hosts_) << text; }
  void reload() const { kill(pid_, SIGHUP); }
  std::string servers() const { return "127.0.0.1:" + std::to_string(port_); }

  // Until dnsmasq answers `name` with `count` addresses (bounded: 100 tries of
  // at most 0.2 s, each a short lookup: dnsmasq may not be listening yet).
  bool wait_for(const std::string& name, std::size_t count) const {
    Resolver resolver({servers(), 0.2, 64});
    for (int i = 0; i < 100; ++i) {
      const Resolution answer = resolver.resolve(name);
      if (answer.outcome == ResolveOutcome::kAddresses &&
          answer.addresses.size() == count) {
        return true;
      }
      usleep(20 * 1000);
    }
    return false;
  }

 private:
  std::string dir_, hosts_;
  int port_ = 0;
  pid_t pid_ = -1;
};

const char* kThree =
    "127.0.0.4 workers.mineru.test\n"
    "127.0.0.2 workers.mineru.test\n"
    "127.0.0.3 workers.mineru.test\n";

class ResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (find_dnsmasq().empty())
      GTEST_SKIP() << "dnsmasq is not installed (dnsmasq-base)";
  }
};

TEST_F(ResolverTest, AnswersEveryAddressSortedAndUnique) {
  Dnsmasq dns(kThree);
  Resolver resolver({dns.servers(), 2.0, 64});
  ASSERT_TRUE(dns.wait_for("workers.mineru.test", 3));
  const Resolution answer = resolver.resolve("workers.mineru.test");
  EXPECT_EQ(answer.outcome, ResolveOutcome::kAddresses);
  EXPECT_EQ(answer.addresses,
            (std::vector<std::string>{"127.0.0.2", "127.0.0.3", "127.0.0.4"}));
  EXPECT_FALSE(answer.truncated);
}

TEST_F(ResolverTest, FollowsTheServerAsItsAnswerChanges) {
  Dnsmasq dns(kThree);
  Resolver resolver({dns.servers(), 2.0, 64});
  ASSERT_TRUE(dns.wait_for("workers.mineru.test", 3));
  dns.write("127.0.0.5 workers.mineru.test\n");
  dns.reload();
  ASSERT_TRUE(dns.wait_for("workers.mineru.test", 1));
  EXPECT_EQ(resolver.resolve("workers.mineru.test").addresses,
            (std::vector<std::string>{"127.0.0.5"}));
}

TEST_F(ResolverTest, CutsAnAnswerAtMaxAddresses) {
  Dnsmasq dns(kThree);
  Resolver resolver({dns.servers(), 2.0, 2});
  ASSERT_TRUE(dns.wait_for("workers.mineru.test", 3));
  const Resolution answer = resolver.resolve("workers.mineru.test");
  EXPECT_EQ(answer.addresses,
            (std::vector<std::string>{"127.0.0.2", "127.0.0.3"}));
  EXPECT_TRUE(answer.truncated);
}

TEST_F(ResolverTest, AnUnknownNameIsEmptyNotFailed) {
  Dnsmasq dns(kThree);
  Resolver resolver({dns.servers(), 2.0, 64});
  ASSERT_TRUE(dns.wait_for("workers.mineru.test", 3));
  const Resolution answer = resolver.resolve("nobody.mineru.test");
  EXPECT_EQ(answer.outcome, ResolveOutcome::kEmpty) << answer.error;
  EXPECT_TRUE(answer.addresses.empty());
  EXPECT_FALSE(answer.error.empty());
}

TEST(ResolverNoServer, ASilentServerFailsWithinItsBound) {
  // Nothing listens there: refused or unanswered, the lookup fails, in bound.
  Resolver resolver({"127.0.0.1:" + std::to_string(free_port()), 0.3, 64});
  const Resolution answer = resolver.resolve("workers.mineru.test");
  EXPECT_EQ(answer.outcome, ResolveOutcome::kFailed);
  EXPECT_FALSE(answer.error.empty());
}

TEST(ResolverNoServer, AnAddressIsItsOwnAnswer) {
  Resolver resolver({"127.0.0.1:9", 0.3, 64});
  const Resolution answer = resolver.resolve("127.0.0.7");
  EXPECT_EQ(answer.outcome, ResolveOutcome::kAddresses) << answer.error;
  EXPECT_EQ(answer.addresses, (std::vector<std::string>{"127.0.0.7"}));
  EXPECT_EQ(resolver.resolve("fd00::7").addresses,
            (std::vector<std::string>{"fd00::7"}));
}

TEST(ResolverOptionsTest, BadOptionsAreRefused) {
  EXPECT_THROW(Resolver({"not a server list", 1.0, 64}), std::invalid_argument);
  EXPECT_THROW(Resolver({"", 0.0, 64}), std::invalid_argument);
  EXPECT_THROW(Resolver({"", 1.0, 0}), std::invalid_argument);
}

TEST(ResolverOptionsTest, OutcomeNames) {
  EXPECT_STREQ(to_string(ResolveOutcome::kAddresses), "addresses");
  EXPECT_STREQ(to_string(ResolveOutcome::kEmpty), "empty");
  EXPECT_STREQ(to_string(ResolveOutcome::kFailed), "failed");
}

TEST(ResolverOptionsTest, NotANameFails) {
  Resolver resolver({"127.0.0.1:9", 0.3, 64});
  EXPECT_EQ(resolver.resolve("").outcome, ResolveOutcome::kFailed);
}

}  // namespace
}  // namespace mineru_health
