// Probe requests and the transfer driver: curl_multi_socket_action over an
// epoll set, every curl and system call checked. See curl_transfer.h for
// why the event-driven interface.
#include "curl_transfer.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

namespace mineru_health::internal {
namespace {

// curl's default 16 KiB receive buffer per easy handle costs 160 MB at
// 10,000 concurrent probes; /health bodies are a few hundred bytes.
constexpr long kReceiveBufferBytes = 4096;
// Ready sockets handled per epoll_wait; the rest stay ready for the next.
constexpr int kMaxEventsPerWait = 1024;
constexpr std::uint32_t kIn = EPOLLIN;
constexpr std::uint32_t kOut = EPOLLOUT;

// curl reads 0 ms as "no timeout": never round a tiny timeout down to it.
long to_ms_ceil(double seconds) {
  return std::max(1L, static_cast<long>(std::ceil(seconds * 1000.0)));
}

// Runs inside curl: must not throw. A short count makes curl abort the
// transfer with CURLE_WRITE_ERROR, which is how an oversized body ends.
std::size_t write_body(char* data, std::size_t size, std::size_t count,
                       void* user) noexcept {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  if (t->body.size() + n > t->max_body) {
    t->truncated = true;
    return 0;
  }
  try {
    t->body.append(data, n);
  } catch (...) {
    t->out_of_memory = true;
    return 0;
  }
  return n;
}

struct UrlCleanup {
  void operator()(CURLU* url) const noexcept { curl_url_cleanup(url); }
};
using Url = std::unique_ptr<CURLU, UrlCleanup>;

struct CurlFree {
  void operator()(char* text) const noexcept { curl_free(text); }
};
using CurlText = std::unique_ptr<char, CurlFree>;

// True when the URL's host is a numeric IPv4/IPv6 address (parsed by curl).
bool host_is_ip_literal(const std::string& url) {
  Url u(curl_url());
  if (!u || curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK)
    return false;
  char* raw = nullptr;
  if (curl_url_get(u.get(), CURLUPART_HOST, &raw, 0) != CURLUE_OK) return false;
  CurlText host(raw);
  if (!host) return false;
  std::string h = host.get();
  if (h.size() > 2 && h.front() == '[' && h.back() == ']')
    h = h.substr(1, h.size() - 2);
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, h.c_str(), buf) == 1 ||
         inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

ProbeStatus status_for(CURLcode rc) {
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
      return ProbeStatus::kTimeout;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      return ProbeStatus::kConnectError;
    default:
      return ProbeStatus::kTransportError;
  }
}

std::string errno_text(const char* call) {
  return fmt::format("{}: {}", call, std::strerror(errno));
}

}  // namespace

std::string configure_request(Transfer& t, const std::string& url,
                              ProbeEndpoint endpoint, double timeout_s,
                              const RequestSetup& setup) {
  CURL* e = t.easy.get();
  if (e == nullptr) return "curl_easy_init failed";
  t.url = url;
  t.endpoint = endpoint;
  t.body.clear();
  t.truncated = false;
  t.out_of_memory = false;
  t.error[0] = '\0';
  t.max_body = setup.max_body_bytes;
  CURLcode rc = CURLE_OK;
  const char* failed = nullptr;
  auto set = [&](CURLoption option, const char* name, auto value) {
    if (rc != CURLE_OK) return;
    rc = curl_easy_setopt(e, option, value);
    if (rc != CURLE_OK) failed = name;
  };
  // curl copies string options, so t.url may change later.
  set(CURLOPT_URL, "URL", t.url.c_str());
  set(CURLOPT_PRIVATE, "PRIVATE", static_cast<void*>(&t));
  set(CURLOPT_ERRORBUFFER, "ERRORBUFFER", t.error);
  set(CURLOPT_WRITEFUNCTION, "WRITEFUNCTION", &write_body);
  set(CURLOPT_WRITEDATA, "WRITEDATA", static_cast<void*>(&t));
  // Signals are the owner's (Python's); curl must not install handlers.
  set(CURLOPT_NOSIGNAL, "NOSIGNAL", 1L);
  set(CURLOPT_CONNECTTIMEOUT_MS, "CONNECTTIMEOUT_MS",
      to_ms_ceil(std::min(setup.connect_timeout_s, timeout_s)));
  set(CURLOPT_TIMEOUT_MS, "TIMEOUT_MS", to_ms_ceil(timeout_s));
  set(CURLOPT_FOLLOWLOCATION, "FOLLOWLOCATION", 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
  set(CURLOPT_PROTOCOLS_STR, "PROTOCOLS_STR", "http,https");
#else
  set(CURLOPT_PROTOCOLS, "PROTOCOLS",
      static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  if (!setup.ca_file.empty()) {
    set(CURLOPT_CAINFO, "CAINFO", setup.ca_file.c_str());
  }
  set(CURLOPT_HTTPHEADER, "HTTPHEADER", setup.headers);
  set(CURLOPT_USERAGENT, "USERAGENT", "mineru-health-probe");
  set(CURLOPT_BUFFERSIZE, "BUFFERSIZE", kReceiveBufferBytes);
  if (setup.forbid_reuse) set(CURLOPT_FORBID_REUSE, "FORBID_REUSE", 1L);
  if (setup.forbid_reuse || host_is_ip_literal(t.url)) {
    // curl 7.88 caches even IP literals per host:port and walks the whole
    // cache on every new connection: with thousands of workers that is
    // quadratic. Nothing to cache for an address, or in a one-shot sweep.
    set(CURLOPT_DNS_CACHE_TIMEOUT, "DNS_CACHE_TIMEOUT", 0L);
  }
  if (rc != CURLE_OK) {
    return fmt::format("curl_easy_setopt(CURLOPT_{}): {}", failed,
                       curl_easy_strerror(rc));
  }
  return "";
}

ProbeResult finish_transfer(const Transfer& t, CURLcode result,
                            const ProbeExpectations& expect) {
  CURL* e = t.easy.get();
  // getinfo fails only for an unknown option or a bad handle; the zero
  // defaults (no status, no latency) then say "not known".
  long http_status = 0;
  if (curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http_status) != CURLE_OK)
    http_status = 0;
  curl_off_t total_us = 0;
  if (curl_easy_getinfo(e, CURLINFO_TOTAL_TIME_T, &total_us) != CURLE_OK)
    total_us = 0;
  ProbeResult r;
  if (result == CURLE_OK || (result == CURLE_WRITE_ERROR && t.truncated)) {
    if (t.endpoint == ProbeEndpoint::kMain &&
        !expect.main_port_status.empty()) {
      ProbeExpectations main = expect;
      main.expected_status = expect.main_port_status;
      r = classify_health_response(http_status, t.body, t.truncated, main);
    } else {
      r = classify_health_response(http_status, t.body, t.truncated, expect);
    }
  } else {
    r.status = status_for(result);
    r.http_status = http_status;
    if (t.out_of_memory) {
      r.detail = "out of memory reading the body";
    } else if (t.error[0] != '\0') {
      r.detail = t.error;
    } else {
      r.detail = curl_easy_strerror(result);
    }
  }
  r.worker_id = t.worker_id;
  r.latency_s = static_cast<double>(total_us) / 1e6;
  r.endpoint = t.endpoint;
  r.url = t.url;
  return r;
}

std::string main_health_url(const std::string& base) {
  std::string url = base;
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url + "/health";
}

std::optional<std::string> native_health_url(const std::string& base,
                                             int port) {
  if (port < 1 || port > 65535) return std::nullopt;
  Url u(curl_url());
  if (!u) return std::nullopt;
  const std::string port_text = std::to_string(port);
  // Keep the host (and only the host) of the URL the owner gave; a null
  // part clears it, so no user, query or fragment survives.
  if (curl_url_set(u.get(), CURLUPART_URL, base.c_str(), 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_SCHEME, "http", 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_PORT, port_text.c_str(), 0) !=
          CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_PATH, "/health", 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_QUERY, nullptr, 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_FRAGMENT, nullptr, 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_USER, nullptr, 0) != CURLUE_OK ||
      curl_url_set(u.get(), CURLUPART_PASSWORD, nullptr, 0) != CURLUE_OK) {
    return std::nullopt;
  }
  char* raw = nullptr;
  if (curl_url_get(u.get(), CURLUPART_URL, &raw, 0) != CURLUE_OK)
    return std::nullopt;
  CurlText text(raw);
  if (!text) return std::nullopt;
  return std::string(text.get());
}

EasyHandle EasyPool::take() {
  if (spare_.empty()) return EasyHandle(curl_easy_init());
  EasyHandle e = std::move(spare_.back());
  spare_.pop_back();
  curl_easy_reset(e.get());
  return e;
}

void EasyPool::give(std::unique_ptr<Transfer> t) {
  t->attached.reset();
  if (t->easy && spare_.size() < keep_) spare_.push_back(std::move(t->easy));
}

// --- TransferDriver ---

namespace {

// epoll_event.data of the wake fd; sockets carry (shard << 32) | fd.
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};

std::uint64_t socket_tag(std::size_t shard, curl_socket_t socket) {
  return (static_cast<std::uint64_t>(shard) << 32) |
         static_cast<std::uint32_t>(socket);
}

}  // namespace

std::unique_ptr<TransferDriver> TransferDriver::create(int wake_fd,
                                                       std::string* error) {
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) {
    *error = errno_text("epoll_create1");
    return nullptr;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    *error = errno_text("epoll_ctl(wake fd)");
    return nullptr;
  }
  std::unique_ptr<TransferDriver> driver(
      new TransferDriver(std::move(epoll), wake_fd));
  std::string why = driver->ensure_shards(1);
  if (!why.empty()) {
    *error = std::move(why);
    return nullptr;
  }
  return driver;
}

TransferDriver::TransferDriver(UniqueFd epoll, int wake_fd)
    : epoll_(std::move(epoll)), wake_fd_(wake_fd) {}

TransferDriver::~TransferDriver() = default;

std::string TransferDriver::ensure_shards(std::size_t count) {
  while (shards_.size() < count) {
    MultiHandle multi(curl_multi_init());
    if (!multi) return "curl_multi_init failed";
    auto shard = std::make_unique<Shard>();
    shard->driver = this;
    shard->index = shards_.size();
    CURLM* m = multi.get();
    CURLMcode mc = curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, &on_socket);
    if (mc == CURLM_OK)
      mc = curl_multi_setopt(m, CURLMOPT_SOCKETDATA, shard.get());
    if (mc == CURLM_OK)
      mc = curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, &on_timer);
    if (mc == CURLM_OK)
      mc = curl_multi_setopt(m, CURLMOPT_TIMERDATA, shard.get());
    if (mc == CURLM_OK && max_connects_ > 0) {
      mc = curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, max_connects_);
    }
    if (mc != CURLM_OK) {
      return fmt::format("curl_multi_setopt: {}", curl_multi_strerror(mc));
    }
    shard->multi = std::move(multi);
    shards_.push_back(std::move(shard));
  }
  return "";
}

std::string TransferDriver::set_max_connects(long connections) {
  // Spread over the shards: each keeps the connections of its own workers.
  // Hashing workers onto shards is uneven, so leave room: a shard over its
  // cap closes its oldest connection (and walks its cache to find it).
  const long shards = static_cast<long>(shards_.size());
  const long share = (connections + shards - 1) / shards;
  max_connects_ = std::max(1L, std::min(connections, 2 * share + 64));
  for (const std::unique_ptr<Shard>& shard : shards_) {
    const CURLMcode mc = curl_multi_setopt(shard->multi.get(),
                                           CURLMOPT_MAXCONNECTS, max_connects_);
    if (mc != CURLM_OK) {
      return fmt::format("curl_multi_setopt(CURLMOPT_MAXCONNECTS): {}",
                         curl_multi_strerror(mc));
    }
  }
  return "";
}

std::string TransferDriver::add(Transfer& t, std::size_t shard_key) {
  Shard& shard = *shards_[shard_key % shards_.size()];
  t.attached = MultiAttachment(shard.multi.get(), t.easy.get());
  if (!t.attached.ok()) {
    return fmt::format("curl_multi_add_handle: {}",
                       curl_multi_strerror(t.attached.code()));
  }
  return "";
}

int TransferDriver::on_socket(CURL* /*easy*/, curl_socket_t socket, int what,
                              void* user, void* socket_data) {
  auto* shard = static_cast<Shard*>(user);
  TransferDriver* self = shard->driver;
  const int epfd = self->epoll_.get();
  if (what == CURL_POLL_REMOVE) {
    // ENOENT/EBADF: the socket is already gone, which is all we want.
    epoll_ctl(epfd, EPOLL_CTL_DEL, socket, nullptr);
    return 0;
  }
  epoll_event ev{};
  ev.events = ((what & CURL_POLL_IN) != 0 ? kIn : 0u) |
              ((what & CURL_POLL_OUT) != 0 ? kOut : 0u);
  ev.data.u64 = socket_tag(shard->index, socket);
  const bool known = socket_data != nullptr;
  int rc = epoll_ctl(epfd, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, socket, &ev);
  // A reused descriptor number, or one closed behind curl's back: switch.
  if (rc != 0 && !known && errno == EEXIST) {
    rc = epoll_ctl(epfd, EPOLL_CTL_MOD, socket, &ev);
  } else if (rc != 0 && known && errno == ENOENT) {
    rc = epoll_ctl(epfd, EPOLL_CTL_ADD, socket, &ev);
  }
  if (rc != 0) {
    // Returning 0 and reporting from run_once: the owner drops every
    // transfer and rebuilds the driver, so none waits on a socket nobody
    // watches.
    if (self->callback_error_.empty())
      self->callback_error_ = errno_text("epoll_ctl");
    return 0;
  }
  if (!known) {
    const CURLMcode mc = curl_multi_assign(shard->multi.get(), socket, shard);
    if (mc != CURLM_OK && self->callback_error_.empty()) {
      self->callback_error_ =
          fmt::format("curl_multi_assign: {}", curl_multi_strerror(mc));
    }
  }
  return 0;
}

int TransferDriver::on_timer(CURLM* /*multi*/, long timeout_ms, void* user) {
  auto* shard = static_cast<Shard*>(user);
  // -1: no timer. Never call curl from here (curl's rule): run_once does.
  if (timeout_ms < 0) {
    shard->timer_at.reset();
  } else {
    shard->timer_at = Clock::now() + std::chrono::milliseconds(timeout_ms);
  }
  return 0;
}

std::string TransferDriver::act(Shard& shard, curl_socket_t socket,
                                int events) {
  int running = 0;
  const CURLMcode mc =
      curl_multi_socket_action(shard.multi.get(), socket, events, &running);
  if (mc != CURLM_OK) {
    return fmt::format("curl_multi_socket_action: {}", curl_multi_strerror(mc));
  }
  return "";
}

void TransferDriver::collect(Shard& shard, std::vector<Done>& done) {
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(shard.multi.get(), &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    void* priv = nullptr;
    // Every handle added here carries its Transfer; a handle without one
    // would be a bug, and there is nothing to report it to.
    if (curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv) !=
            CURLE_OK ||
        priv == nullptr) {
      continue;
    }
    done.push_back(Done{static_cast<Transfer*>(priv), msg->data.result});
  }
}

std::string TransferDriver::run_once(int max_wait_ms, std::vector<Done>& done) {
  int wait_ms = std::max(0, max_wait_ms);
  const auto now = Clock::now();
  for (const std::unique_ptr<Shard>& shard : shards_) {
    if (!shard->timer_at) continue;
    const auto until =
        std::chrono::ceil<std::chrono::milliseconds>(*shard->timer_at - now);
    wait_ms =
        until.count() <= 0
            ? 0
            : static_cast<int>(std::min<long long>(wait_ms, until.count()));
  }
  std::array<epoll_event, kMaxEventsPerWait> ready{};
  int n = epoll_wait(epoll_.get(), ready.data(), kMaxEventsPerWait, wait_ms);
  if (n < 0) {
    if (errno != EINTR) return errno_text("epoll_wait");
    n = 0;
  }
  std::string error;
  auto keep_first = [&error](std::string why) {
    if (!why.empty() && error.empty()) error = std::move(why);
  };
  for (int i = 0; i < n; ++i) {
    const epoll_event& ev = ready[static_cast<std::size_t>(i)];
    if (ev.data.u64 == kWakeTag) {
      std::uint64_t counter = 0;
      // EAGAIN: another wake-up was already consumed; nothing to do.
      if (read(wake_fd_, &counter, sizeof counter) < 0 && errno != EAGAIN) {
        keep_first(errno_text("read(wake fd)"));
      }
      continue;
    }
    const std::size_t shard = static_cast<std::size_t>(ev.data.u64 >> 32);
    const auto socket = static_cast<curl_socket_t>(ev.data.u64 & 0xffffffffu);
    if (shard >= shards_.size()) continue;  // cannot happen: tags are ours
    int events = 0;
    if ((ev.events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) != 0)
      events |= CURL_CSELECT_IN;
    if ((ev.events & EPOLLOUT) != 0) events |= CURL_CSELECT_OUT;
    if ((ev.events & EPOLLERR) != 0) events |= CURL_CSELECT_ERR;
    keep_first(act(*shards_[shard], socket, events));
  }
  const auto after = Clock::now();
  for (const std::unique_ptr<Shard>& shard : shards_) {
    if (shard->timer_at && *shard->timer_at <= after) {
      shard->timer_at.reset();
      keep_first(act(*shard, CURL_SOCKET_TIMEOUT, 0));
    }
    collect(*shard, done);
  }
  if (!callback_error_.empty()) keep_first(callback_error_);
  return error;
}

}  // namespace mineru_health::internal
