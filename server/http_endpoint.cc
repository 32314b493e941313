#include "server/http_endpoint.h"

#include <httplib.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/remote_decode.h"

namespace vaedecode::server {
namespace {

void Send(const HttpReply& reply, httplib::Response& res) {
  res.status = reply.status;
  for (const auto& [name, value] : reply.headers) res.set_header(name, value);
  res.set_content(reply.body, reply.content_type);
}

// The query of a request target, every pair kept: httplib's own parse drops
// repeated identical pairs, and shape=1&shape=4&shape=64&shape=64 repeats.
QueryParams ParseQuery(const std::string& target) {
  QueryParams params;
  const size_t q = target.find('?');
  if (q == std::string::npos) return params;
  for (absl::string_view pair : absl::StrSplit(absl::string_view(target).substr(q + 1), '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    const std::string key(pair.substr(0, eq));
    const std::string value(eq == absl::string_view::npos ? "" : pair.substr(eq + 1));
    params.emplace(httplib::detail::decode_url(key, true), httplib::detail::decode_url(value, true));
  }
  return params;
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
  // The library's own refusals (no route, body too large) as JSON errors.
  const int64_t max_request_bytes = options.max_request_bytes;
  http.set_error_handler([max_request_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    absl::Status status;
    if (res.status == 413) {
      status = absl::ResourceExhaustedError(absl::StrCat("the request body is more than --max_message_bytes=",
                                                         max_request_bytes, "; send a smaller batch or clip"));
    } else if (res.status == 404) {
      status = absl::NotFoundError(absl::StrCat(req.method, " ", req.path,
                                                ": no such endpoint; POST / or /models/NAME, GET /health"));
    } else {
      status = absl::InvalidArgumentError(absl::StrCat("HTTP ", res.status));
    }
    const int code = res.status;
    Send(ErrorReply(status), res);
    res.status = code;
  });

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
      Send(ErrorReply(absl::UnavailableError(why)), res);
    }
  };
  http.Get("/health", health);
  http.Get(R"(/health/([^/]+))", health);

  const auto decode = [&service, &catalog, options](const httplib::Request& req, httplib::Response& res) {
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
        absl::StatusOr<RemoteDecodeCall> call = TranslateRemoteDecode(ParseQuery(req.target), req.body, *info);
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
    CollectedOutput out = service.DecodeCollected(std::move(request), received + options.request_timeout, "http",
                                                  options.max_output_bytes, refusal);
    HttpReply reply = BuildRemoteDecodeReply(kind, std::move(out));
    Send(reply, res);
  };
  http.Post("/", decode);
  http.Post(R"(/models/([^/]+))", decode);

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
