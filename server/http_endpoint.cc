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
#include "server/oip_rest.h"
#include "server/oip_translation.h"
#include "server/peer_connection.h"
#include "server/remote_decode.h"
#include "server/remote_encode.h"

namespace vaedecode::server {
namespace {

// How often a handler waiting for its decode looks at its client's connection.
constexpr absl::Duration kClientPoll = absl::Milliseconds(100);

// What the routes below serve, for the 404, 405 and 501 messages.
constexpr char kServed[] =
    "remote_decode: POST / or /models/NAME, remote_encode: POST /encode or /models/NAME/encode, GET /health or "
    "/health/NAME; Open Inference Protocol: GET "
    "/v2/health/live, /v2/health/ready, /v2, /v2/models/NAME[/ready|/config|/stats], /v2/models/stats, POST "
    "/v2/models/NAME/infer, /v2/repository/index";
// NAME and an optional version: matches[1], matches[2].
constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

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
  return absl::InvalidArgumentError(
      absl::StrCat("this server has several models; POST to /models/NAME with one of: ", absl::StrJoin(names, ", ")));
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
  // The limit holds for the bytes as they arrive after the library's
  // decoding: a chunked or length-less body, or a gzip one that inflates,
  // stops being read at it (the library checks only Content-Length).
  bool over_limit = false;
  const bool read = reader([&body, &over_limit, max_bytes](const char* data, size_t n) {
    if (body.bytes.size() + n > static_cast<uint64_t>(max_bytes)) {
      over_limit = true;
      return false;
    }
    body.bytes.append(data, n);
    return true;
  });
  if (!read || over_limit) {
    const uint64_t length = req.get_header_value<uint64_t>("Content-Length");
    int wire_status = 0;
    if (absl::Status refusal = BoundedHttpServer::WireRefusal(&wire_status); !refusal.ok()) {
      body.status = absl::Status(
          refusal.code(), absl::StrCat(refusal.message(), ": ", body.bytes.size(), " of ", length, " bytes arrived"));
      body.http_status = wire_status;
    } else if (over_limit || length > static_cast<uint64_t>(max_bytes)) {
      const std::string size = over_limit && length <= static_cast<uint64_t>(max_bytes)
                                   ? absl::StrCat("over ", max_bytes)
                                   : absl::StrCat(length);
      body.status = absl::ResourceExhaustedError(absl::StrCat("the request body is ", size,
                                                              " bytes, more than --max_message_bytes=", max_bytes,
                                                              "; send a smaller batch or clip"));
      body.http_status = 413;
    } else {
      body.status = absl::InvalidArgumentError(
          absl::StrCat("the request body could not be read (", body.bytes.size(), " of ", length, " bytes arrived)"));
    }
  }
  return body;
}

// One collected decode or encode on behalf of an HTTP request, started by
// `start`: cancelled when the client closes its connection (an abandoned
// request frees its group at once, and is logged and counted CANCELLED).
using StartCollection = std::function<std::shared_ptr<Job>(std::function<void(CollectedOutput)> done)>;
CollectedOutput CollectForClient(const httplib::Request& req, const StartCollection& start) {
  auto finished = std::make_shared<absl::Notification>();
  auto out = std::make_shared<CollectedOutput>();
  std::shared_ptr<Job> job = start([finished, out](CollectedOutput o) {
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

CollectedOutput DecodeForClient(DecodeService& service, const httplib::Request& req, v1::DecodeRequest request,
                                absl::Time deadline, const char* protocol, int64_t max_output_bytes,
                                absl::Status refusal) {
  return CollectForClient(req, [&](std::function<void(CollectedOutput)> done) {
    return service.StartCollected(std::move(request), deadline, protocol, max_output_bytes, std::move(refusal),
                                  std::move(done));
  });
}

// Every route: its path pattern and the methods it serves. A known path
// asked with another method is 405 with Allow, not 404.
struct Route {
  std::string pattern;
  std::vector<std::string> methods;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options, DecodeService& service,
                                                                  ModelCatalog& catalog, const OipAnswers& oip,
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
  e->http_ = std::make_unique<BoundedHttpServer>(options.connections);
  httplib::Server& http = *e->http_;
  http.set_payload_max_length(static_cast<size_t>(options.max_request_bytes));
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a
  // second server on this port would start and take half the connections.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // The library's own refusals (malformed requests, no route, a request
  // line over its limit) as JSON errors that say what happened.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int code = res.status;
    int wire_status = 0;
    absl::Status status = BoundedHttpServer::WireRefusal(&wire_status);
    if (!status.ok()) {
      return SendError(status, res, wire_status);  // the library calls it malformed (400)
    } else if (code == 404) {
      status = absl::NotFoundError(absl::StrCat(req.method, " ", req.path, ": no such endpoint; ", kServed));
    } else if (code == 414) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the request line is longer than ", CPPHTTPLIB_REQUEST_URI_MAX_LENGTH,
                       " bytes, this HTTP server's limit; send fewer or shorter query parameters"));
    } else if (code == 413) {
      status =
          absl::ResourceExhaustedError("the request body is larger than this server accepts (--max_message_bytes)");
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
    CollectedOutput out = DecodeForClient(service, req, std::move(request), received + options.request_timeout, "http",
                                          options.max_output_bytes, refusal);
    Send(BuildRemoteDecodeReply(kind, std::move(out)), res);
  };
  post("/", decode);
  // A trailing slash too: diffusers' docs write endpoint URLs that way.
  post(R"(/models/([^/]+)/?)", decode);

  // diffusers' remote_encode (server/remote_encode.h).
  const auto encode = [&service, &catalog, options](const httplib::Request& req, httplib::Response& res,
                                                    std::string body) {
    const absl::Time received = absl::Now();
    RemoteEncodeCall call;
    absl::Status refusal;
    absl::StatusOr<std::string> model = ModelFor(req, options, catalog);
    if (!model.ok()) {
      refusal = model.status();
    } else {
      call.request.set_model(*model);
      absl::StatusOr<v1::ModelInfo> info = catalog.Lookup(*model);
      if (info.ok()) {
        absl::StatusOr<RemoteEncodeCall> translated =
            TranslateRemoteEncode(ParseQuery(req.target), std::move(body), *info);
        if (translated.ok()) {
          call = *std::move(translated);
        } else {
          refusal = translated.status();
        }
      }
      // An unknown model is refused by the admission itself, with the list.
    }
    call.request.set_request_id(req.get_header_value("X-Request-Id"));
    CollectedOutput out = CollectForClient(req, [&](std::function<void(CollectedOutput)> done) {
      return service.StartCollectedEncode(std::move(call.request), received, received + options.request_timeout, "http",
                                          options.max_output_bytes, std::move(refusal), std::move(done));
    });
    Send(BuildRemoteEncodeReply(call, std::move(out)), res);
  };
  post("/encode", encode);
  post(R"(/models/([^/]+)/encode/?)", encode);

  // ---- the Open Inference Protocol's HTTP/REST binding ----
  const auto send_json = [](httplib::Response& res, const std::string& json) {
    res.set_content(json, "application/json");
  };
  const auto send_answer = [send_json](httplib::Response& res, const auto& answer, const auto& to_json) {
    if (answer.ok()) return send_json(res, to_json(*answer));
    SendError(answer.status(), res);
  };
  const auto version = [](const httplib::Request& req) {
    return req.matches.size() > 2 ? std::string(req.matches[2]) : std::string();
  };
  get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  get("/v2/health/ready", [&oip](const httplib::Request&, httplib::Response& res) {
    if (!oip.ServerReady()) SendError(absl::UnavailableError("the server is not serving (starting or draining)"), res);
  });
  get("/v2", [&oip, send_json](const httplib::Request&, httplib::Response& res) {
    send_json(res, ServerMetadataJson(oip.ServerMetadata()));
  });
  // Before M: "stats" would match a model name.
  get("/v2/models/stats", [&oip, send_answer](const httplib::Request&, httplib::Response& res) {
    send_answer(res, oip.ModelStatistics("", ""), ModelStatisticsJson);
  });
  const std::string model_path = kModelPath;
  get(model_path, [&oip, send_answer, version](const httplib::Request& req, httplib::Response& res) {
    send_answer(res, oip.ModelMetadata(req.matches[1], version(req)), ModelMetadataJson);
  });
  get(model_path + "/ready", [&oip, version](const httplib::Request& req, httplib::Response& res) {
    if (!oip.ModelReady(req.matches[1], version(req))) {
      SendError(absl::UnavailableError(absl::StrCat("model \"", std::string(req.matches[1]),
                                                    "\" is not ready (not served by a ready group, or not a model of "
                                                    "this server)")),
                res);
    }
  });
  get(model_path + "/config", [&oip, send_answer, version](const httplib::Request& req, httplib::Response& res) {
    send_answer(res, oip.ModelConfig(req.matches[1], version(req)),
                [](const inference::ModelConfigResponse& r) { return ModelConfigJson(r.config()); });
  });
  get(model_path + "/stats", [&oip, send_answer, version](const httplib::Request& req, httplib::Response& res) {
    send_answer(res, oip.ModelStatistics(req.matches[1], version(req)), ModelStatisticsJson);
  });
  post("/v2/repository/index", [&oip, send_json](const httplib::Request&, httplib::Response& res, std::string body) {
    absl::StatusOr<bool> ready_only = ParseRepositoryIndexRequest(body);
    if (!ready_only.ok()) return SendError(ready_only.status(), res);
    send_json(res, RepositoryIndexJson(oip.RepositoryIndex(*ready_only)));
  });
  post(model_path + "/infer",
       [&service, &oip, options, version](const httplib::Request& req, httplib::Response& res, std::string body) {
         const absl::Time received = absl::Now();
         const std::string name = req.matches[1];
         int64_t header_length = -1;
         absl::Status refusal;
         if (req.has_header("Inference-Header-Content-Length") &&
             !absl::SimpleAtoi(req.get_header_value("Inference-Header-Content-Length"), &header_length)) {
           refusal = absl::InvalidArgumentError("Inference-Header-Content-Length: not a byte count");
         }
         OipInferCall call;
         call.decode.set_model(name);
         bool binary_output = false;
         if (refusal.ok()) {
           absl::StatusOr<RestInferRequest> parsed = ParseRestInferRequest(body, header_length, name, version(req));
           body.clear();
           if (parsed.ok()) {
             binary_output = parsed->binary_output;
             call = oip.PrepareInfer(parsed->request);
           } else {
             refusal = parsed.status();
           }
         }
         if (!call.refusal.ok()) refusal = call.refusal;
         const absl::Time deadline = received + options.request_timeout;
         CollectedOutput out = CollectForClient(req, [&](std::function<void(CollectedOutput)> done) {
           return call.operation == InferOperation::kEncode
                      ? service.StartCollectedEncode(std::move(call.encode), received, deadline, "oip_http",
                                                     options.max_output_bytes, std::move(refusal), std::move(done))
                      : service.StartCollected(std::move(call.decode), deadline, "oip_http", options.max_output_bytes,
                                               std::move(refusal), std::move(done));
         });
         inference::ModelInferResponse response;
         response.set_model_name(name);
         response.set_model_version("1");
         if (absl::Status filled = FillModelInferResponse(std::move(out), &response, call.operation); !filled.ok()) {
           return SendError(filled, res);
         }
         absl::StatusOr<HttpReply> reply = BuildRestInferReply(response, binary_output);
         if (!reply.ok()) return SendError(reply.status(), res);
         Send(*reply, res);
       });

  // Any other method on a served path: 405 naming the ones it takes (the
  // body, if any, is read and dropped so the connection stays usable).
  for (const Route& route : routes) {
    const std::string allow = absl::StrJoin(route.methods, ", ");
    const auto refuse = [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      SendError(absl::InvalidArgumentError(
                    absl::StrCat(req.method, " ", req.path, ": this endpoint takes ", allow, "; ", kServed)),
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

  // The rest of /v2 (model control, shared memory, trace, logging): not
  // served, and said so (after the 405s, so a served path with another
  // method stays 405).
  const auto unserved = [](const httplib::Request& req, httplib::Response& res) {
    SendError(absl::UnimplementedError(
                  absl::StrCat("vaedecode does not serve ", req.method, " ", req.path, "; it serves ", kServed)),
              res);
  };
  http.Get(R"(/v2/.*)", unserved);
  http.Post(R"(/v2/.*)",
            [unserved](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
              ReadBody(req, reader, 0);  // read and dropped: the connection stays usable
              unserved(req, res);
            });

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
