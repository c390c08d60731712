// Resolver: the addresses a DNS name has now (a Kubernetes headless Service,
// say), looked up with c-ares within a bound on time and on addresses.
//
//   mineru_health::Resolver resolver({"127.0.0.1:5353", 2.0, 64});
//   mineru_health::Resolution answer =
//   resolver.resolve("mineru-api.mineru.svc"); switch (answer.outcome) { case
//   ResolveOutcome::kAddresses: ... }
//
// An answer is a value, never an exception: kAddresses (sorted, unique,
// IPv4 and IPv6 as text, at most max_addresses: the rest is cut and
// `truncated` says so), kEmpty (the name has no address: NXDOMAIN, NODATA) or
// kFailed (no answer within timeout_s, a refused query, a server that
// cannot be reached, a bad name; `error` says which). The caller decides what
// an empty or failed answer means (the router keeps its last good set).
//
// `servers` is c-ares' "host:port,host:port" list; "" takes the system's
// (/etc/resolv.conf, with its search domains, as in a pod).
//
// resolve() blocks its caller for at most timeout_s (plus one poll tick):
// call it off any loop that must not wait (the router calls it in a worker
// thread with the GIL released). Thread-safety: one resolve() at a time per
// Resolver (it owns one c-ares channel); distinct Resolvers are independent.
#ifndef MINERU_HEALTH_RESOLVER_H_
#define MINERU_HEALTH_RESOLVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace mineru_health {

struct ResolverOptions {
  std::string servers;     // "" = the system's resolvers
  double timeout_s = 2.0;  // the whole lookup, every retry included
  std::size_t max_addresses = 64;
};

enum class ResolveOutcome { kAddresses, kEmpty, kFailed };

const char* to_string(ResolveOutcome outcome);

struct Resolution {
  ResolveOutcome outcome = ResolveOutcome::kFailed;
  std::vector<std::string> addresses;  // kAddresses only
  bool truncated = false;              // more than max_addresses answered
  std::string error;                   // why kEmpty or kFailed
};

class Resolver {
 public:
  // Bad options (a server list c-ares refuses, timeout_s <= 0,
  // max_addresses 0) throw std::invalid_argument: they are configuration,
  // refused at start-up. A channel c-ares cannot make throws
  // std::runtime_error.
  explicit Resolver(const ResolverOptions& options);
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  [[nodiscard]] Resolution resolve(const std::string& name);

  const ResolverOptions& options() const { return options_; }

 private:
  struct Channel;
  ResolverOptions options_;
  std::unique_ptr<Channel> channel_;
};

}  // namespace mineru_health

#endif  // MINERU_HEALTH_RESOLVER_H_
