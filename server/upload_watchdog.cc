#include "server/upload_watchdog.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/socket_port.h"

namespace vaedecode::server {
namespace {

constexpr absl::Duration kSweep = absl::Seconds(1);

// channelz answers in JSON that it allocates; parsed and freed.
nlohmann::json Channelz(char* text) {
  if (text == nullptr) return nlohmann::json();
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  gpr_free(text);
  return parsed;
}

// channelz writes int64 values as JSON strings and leaves out zeros.
int64_t Int(const nlohmann::json& object, const char* field) {
  if (!object.is_object()) return 0;
  const auto it = object.find(field);
  if (it == object.end()) return 0;
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return it->is_number() ? it->get<int64_t>() : 0;
}

absl::Time Timestamp(const nlohmann::json& data, const char* field) {
  absl::Time t = absl::InfinitePast();
  const auto it = data.find(field);
  if (it != data.end() && it->is_string()) {
    std::string error;
    if (!absl::ParseTime(absl::RFC3339_full, it->get<std::string>(), &t, &error)) t = absl::InfinitePast();
  }
  return t;
}

// The peer's address bytes (4 or 16) and port, as channelz gives them.
struct Peer {
  std::string address;
  int port = 0;
};

bool SamePeer(const sockaddr_storage& addr, const Peer& peer) {
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    return ntohs(in->sin_port) == peer.port && peer.address.size() == 4 &&
           std::memcmp(&in->sin_addr, peer.address.data(), 4) == 0;
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (ntohs(in6->sin6_port) != peer.port) return false;
    if (peer.address.size() == 16) return std::memcmp(&in6->sin6_addr, peer.address.data(), 16) == 0;
    // An IPv4 client on a dual-stack socket: ::ffff:a.b.c.d.
    return peer.address.size() == 4 && IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) &&
           std::memcmp(reinterpret_cast<const char*>(&in6->sin6_addr) + 12, peer.address.data(), 4) == 0;
  }
  return false;
}

// Shuts down this process's connection from `peer` to `local_port`; whether
// one was found.
bool ShutDownConnection(int local_port, const Peer& peer) {
  std::error_code ec;
  std::filesystem::directory_iterator fd("/proc/self/fd", ec);
  for (; !ec && fd != std::filesystem::directory_iterator(); fd.increment(ec)) {
    const int n = std::atoi(fd->path().filename().c_str());
    sockaddr_storage local{}, remote{};
    socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
    if (getsockname(n, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 || PortOf(local) != local_port) continue;
    if (getpeername(n, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0 || !SamePeer(remote, peer)) continue;
    shutdown(n, SHUT_RDWR);
    return true;
  }
  return false;
}

}  // namespace

UploadWatchdog::UploadWatchdog(absl::Duration bound, int grpc_port) : bound_(bound), grpc_port_(grpc_port) {
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(kSweep)) Sweep();
  });
}

UploadWatchdog::~UploadWatchdog() {
  stop_.Notify();
  thread_.join();
}

void UploadWatchdog::Sweep() {
  const nlohmann::json servers = Channelz(grpc_channelz_get_servers(0));
  if (!servers.is_object() || !servers.contains("server") || !servers["server"].is_array()) return;
  const absl::Time now = absl::Now();
  for (const nlohmann::json& server : servers["server"]) {
    const int64_t server_id = Int(server.value("ref", nlohmann::json()), "serverId");
    int64_t start = 0;
    bool end = false;
    while (!end) {
      const nlohmann::json sockets = Channelz(grpc_channelz_get_server_sockets(server_id, start, 500));
      if (!sockets.is_object() || !sockets.contains("socketRef") || !sockets["socketRef"].is_array()) break;
      end = !sockets.contains("end") || sockets["end"] == true || sockets["socketRef"].empty();
      for (const nlohmann::json& ref : sockets["socketRef"]) {
        const int64_t socket_id = Int(ref, "socketId");
        start = socket_id + 1;
        if (cut_sockets_.count(socket_id) > 0) continue;  // closing already
        const nlohmann::json socket = Channelz(grpc_channelz_get_socket(socket_id));
        if (!socket.is_object() || !socket.contains("socket")) continue;
        const nlohmann::json& s = socket["socket"];
        const nlohmann::json data = s.value("data", nlohmann::json::object());
        const int64_t open = Int(data, "streamsStarted") - Int(data, "streamsSucceeded") - Int(data, "streamsFailed");
        const absl::Time opened = Timestamp(data, "lastRemoteStreamCreatedTimestamp");
        const absl::Time received = Timestamp(data, "lastMessageReceivedTimestamp");
        if (open <= 0 || opened == absl::InfinitePast() || received >= opened || now - opened <= bound_) continue;
        const nlohmann::json address =
            s.value("remote", nlohmann::json::object()).value("tcpip_address", nlohmann::json::object());
        Peer peer;
        if (!absl::Base64Unescape(address.value("ip_address", ""), &peer.address)) continue;
        peer.port = static_cast<int>(Int(address, "port"));
        if (!ShutDownConnection(grpc_port_, peer)) continue;
        cut_sockets_.insert(socket_id);
        ++cut_;
        spdlog::warn(
            "event=upload_timeout peer_port={} waited_s={:.0f} message=\"a request was still arriving after "
            "--upload_timeout_s; its connection was closed\"",
            peer.port, absl::ToDoubleSeconds(now - opened));
      }
    }
  }
}

}  // namespace vaedecode::server
