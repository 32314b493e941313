#include "server/http_endpoint.h"

#include <httplib.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "server/http_query.h"
#include "server/peer_connection.h"
#include "server/remote_decode.h"

namespace vaedecode::server {
namespace {

// How often a handler waiting for its decode looks at its client's connection.
constexpr absl::Duration kClientPoll = absl::Milliseconds(100);

// What the routes below serve, for the 404 and 405 messages.
constexpr char kServed[] = "POST / or /models/NAME, GET /health or /health/NAME";

void Send(const HttpReply& reply, httplib::Response& res) {
  res.status = reply.status;
  for (const auto& [name, value] : reply.headers) res.set_header(name, value);
  res.set_content(reply.body, reply.content_type);
}

void SendError(const absl::Status& status, httplib::Response& res, int http_status = 0) {
  HttpReply reply = ErrorReply(status);
  if (http_status != 0) reply.status = http_status;
  Send(reply, res);
}

// The model a path names, or the default.
absl::StatusOr<std::string> ModelFor(const httplib::Request& req, const HttpEndpointOptions& options,
                                     const ModelCatalog& catalog) {
  if (req.matches.size() > 1) return std::string(req.matches[1]);
  if (!options.default_model.empty()) return options.default_model;
  const std::vector<std::string> names = catalog.Names();
  if (names.size() == 1) return names[0];
  return absl::InvalidArgumentError(absl::StrCat("this server has several models; POST to /models/NAME with one of: ",
                                                 absl::StrJoin(names, ", ")));
}

// The body as raw bytes, whatever its Content-Type: read through the
// library's content reader, which neither parses a form (curl's default
// type, which the library would cap at 8 KiB) nor keeps anything but the
// bytes. A multipart body is read and dropped (so the connection stays
// usable), then refused: the latent is the body itself.
struct Body {
  std::string bytes;
  absl::Status status;
  int http_status = 0;  // the refusal's HTTP status, when it is not the code's
};
Body ReadBody(const httplib::Request& req, const httplib::ContentReader& reader, int64_t max_bytes) {
  Body body;
  if (req.is_multipart_form_data()) {
    reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
    body.status = absl::InvalidArgumentError(absl::StrCat(
        "Content-Type ", req.get_header_value("Content-Type"),
        ": a multipart form is not read; POST the tensor's raw bytes as the body (any other Content-Type, e.g. "
        "tensor/binary or application/octet-stream)"));
    body.http_status = 415;
    return body;
  }
  const bool read = reader([&body](const char* data, size_t n) {
    body.bytes.append(data, n);
    return true;
  });
  if (!read) {
    const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
    if (length > static_cast<uint64_t>(max_bytes)) {
      body.status = absl::ResourceExhaustedError(absl::StrCat("the request body is ", length,
                                                              " bytes, more than --max_message_bytes=", max_bytes,
                                                              "; send a smaller batch or clip"));
      body.http_status = 413;
    } else {
      body.status = absl::InvalidArgumentError(absl::StrCat(
          "the request body could not be read (", body.bytes.size(), " of ", length, " bytes arrived)"));
    }
  }
  return body;
}

// One collected decode on behalf of an HTTP request: cancelled when the
// client closes its connection (an abandoned request frees its group at
// once, and is logged and counted CANCELLED).
CollectedOutput DecodeForClient(DecodeService& service, const httplib::Request& req, v1::DecodeRequest request,
                                absl::Time deadline, int64_t max_output_bytes, absl::Status refusal) {
  auto finished = std::make_shared<absl::Notification>();
  auto out = std::make_shared<CollectedOutput>();
  std::shared_ptr<Job> job = service.StartCollected(std::move(request), deadline, "http", max_output_bytes,
                                                    std::move(refusal), [finished, out](CollectedOutput o) {
                                                      *out = std::move(o);
                                                      finished->Notify();
                                                    });
  const std::optional<PeerConnection> peer = PeerConnection::Find(req.local_port, req.remote_addr, req.remote_port);
  bool cancelled = false;
  while (!finished->WaitForNotificationWithTimeout(kClientPoll)) {
    if (!cancelled && peer && peer->Closed()) {
      cancelled = true;
      job->Cancel(absl::CancelledError("the HTTP client closed its connection"));
    }
  }
  return std::move(*out);
}

// Every route: its path pattern and the methods it serves. A known path
// asked with another method is 405 with Allow, not 404.
struct Route {
  std::string pattern;
  std::vector<std::string> methods;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options,
                                                                  DecodeService& service, ModelCatalog& catalog,
                                                                  std::function<bool()> serving) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_listen=", options.listen, ": use HOST:PORT"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);

  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->options_ = options;
  e->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *e->http_;
  const int threads = std::max(1, options.threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(static_cast<size_t>(options.max_request_bytes));
  http.set_read_timeout(60);
  http.set_write_timeout(60);
  // The library's own refusals (malformed requests, no route, a request
  // line over its limit) as JSON errors that say what happened.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int code = res.status;
    absl::Status status;
    if (code == 404) {
      status = absl::NotFoundError(absl::StrCat(req.method, " ", req.path, ": no such endpoint; ", kServed));
    } else if (code == 414) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "the request line is longer than ", CPPHTTPLIB_REQUEST_URI_MAX_LENGTH,
          " bytes, this HTTP server's limit; send fewer or shorter query parameters"));
    } else if (code == 413) {
      status = absl::ResourceExhaustedError("the request body is larger than this server accepts (--max_message_bytes)");
    } else if (code == 400) {
      status = absl::InvalidArgumentError(
          "a malformed HTTP request (its request line or headers could not be parsed, or the method is unknown)");
    } else {
      status = absl::UnknownError(absl::StrCat("the HTTP server refused the request with status ", code));
    }
    SendError(status, res, code);
  });

  std::vector<Route> routes;
  const auto get = [&http, &routes](const std::string& pattern, httplib::Server::Handler handler) {
    routes.push_back({pattern, {"GET", "HEAD"}});
    http.Get(pattern, std::move(handler));
  };
  using BodyHandler = std::function<void(const httplib::Request&, httplib::Response&, std::string body)>;
  const int64_t max_request_bytes = options.max_request_bytes;
  const auto post = [&http, &routes, max_request_bytes](const std::string& pattern, BodyHandler handler) {
    routes.push_back({pattern, {"POST"}});
    http.Post(pattern, [handler = std::move(handler), max_request_bytes](
                           const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      Body body = ReadBody(req, reader, max_request_bytes);
      if (!body.status.ok()) return SendError(body.status, res, body.http_status);
      handler(req, res, std::move(body.bytes));
    });
  };

  const auto health = [&catalog, serving](const httplib::Request& req, httplib::Response& res) {
    bool ok = serving();
    std::string why = "the server is not serving (starting or draining)";
    if (ok && req.matches.size() > 1) {
      const std::string model = req.matches[1];
      ok = catalog.Serving(model);
      why = absl::StrCat("model \"", model, "\" is not served by a ready group");
    }
    if (ok) {
      res.set_content("Ok", "text/plain");
    } else {
      SendError(absl::UnavailableError(why), res);
    }
  };
  get("/health", health);
  get(R"(/health/([^/]+))", health);

  const auto decode = [&service, &catalog, options](const httplib::Request& req, httplib::Response& res,
                                                   std::string body) {
    const absl::Time received = absl::Now();
    v1::DecodeRequest request;
    absl::Status refusal;
    RemoteReply kind = RemoteReply::kTensor;
    absl::StatusOr<std::string> model = ModelFor(req, options, catalog);
    if (!model.ok()) {
      refusal = model.status();
    } else {
      request.set_model(*model);
      absl::StatusOr<v1::ModelInfo> info = catalog.Lookup(*model);
      if (info.ok()) {
        absl::StatusOr<RemoteDecodeCall> call = TranslateRemoteDecode(ParseQuery(req.target), std::move(body), *info);
        if (call.ok()) {
          request = std::move(call->request);
          kind = call->reply;
        } else {
          refusal = call.status();
        }
      }
      // An unknown model is refused by the admission itself, with the list.
    }
    request.set_request_id(req.get_header_value("X-Request-Id"));
    CollectedOutput out = DecodeForClient(service, req, std::move(request), received + options.request_timeout,
                                          options.max_output_bytes, refusal);
    Send(BuildRemoteDecodeReply(kind, std::move(out)), res);
  };
  post("/", decode);
  // A trailing slash too: diffusers' docs write endpoint URLs that way.
  post(R"(/models/([^/]+)/?)", decode);

  // Any other method on a served path: 405 naming the ones it takes (the
  // body, if any, is read and dropped so the connection stays usable).
  for (const Route& route : routes) {
    const std::string allow = absl::StrJoin(route.methods, ", ");
    const auto refuse = [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      SendError(absl::InvalidArgumentError(absl::StrCat(req.method, " ", req.path, ": this endpoint takes ", allow,
                                                        "; ", kServed)),
                res, 405);
    };
    const auto refuse_with_body = [refuse](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
      if (req.is_multipart_form_data()) {
        reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
      } else {
        reader([](const char*, size_t) { return true; });
      }
      refuse(req, res);
    };
    const auto has = [&route](const char* method) {
      return std::find(route.methods.begin(), route.methods.end(), method) != route.methods.end();
    };
    if (!has("GET")) http.Get(route.pattern, refuse);
    if (!has("POST")) http.Post(route.pattern, refuse_with_body);
    http.Put(route.pattern, refuse_with_body);
    http.Patch(route.pattern, refuse_with_body);
    http.Delete(route.pattern, refuse_with_body);
    http.Options(route.pattern, [allow](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", allow);
      res.status = 204;
    });
  }

  if (port == 0) {
    e->port_ = http.bind_to_any_port(host);
  } else {
    e->port_ = http.bind_to_port(host, port) ? port : -1;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --http_listen=", options.listen));
  }
  e->listener_ = std::thread([raw = e->http_.get()] { raw->listen_after_bind(); });
  return e;
}

void HttpEndpoint::Stop() {
  if (!http_) return;
  http_->stop();  // closes the socket; the pool finishes the requests it has
  if (listener_.joinable()) listener_.join();
  http_.reset();
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

}  // namespace vaedecode::server
