// Python bindings of the metrics proxy's per-scrape path. The heavy calls (read, parse, add,
// finish, fetch) release the GIL; families cross as opaque, immutable lists. The scrape server
// calls back into Python (with the GIL) only to log a warning and, if asked, before each read.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "metrics.h"
#include "scrape.h"

namespace py = pybind11;
namespace m = llm_serving::metrics;

namespace {

// Families produced by one read or parse, shared by every body written from them.
struct FamilyList {
  std::shared_ptr<const std::vector<m::Family>> families;
  int files = 0;
  std::vector<std::string> corrupt;
};

// The encoder and its lock: bodies written from several Python threads take turns.
struct PyEncoder {
  explicit PyEncoder(m::Labels labels)
      : encoder(std::make_shared<m::Encoder>(std::move(labels))),
        mutex(std::make_shared<std::mutex>()) {}
  std::shared_ptr<m::Encoder> encoder;
  std::shared_ptr<std::mutex> mutex;
};

// One body being written, holding its encoder's lock during each call.
struct Writer {
  Writer(const PyEncoder& enc, bool openmetrics, bool gzip) : mutex(enc.mutex) {
    std::lock_guard<std::mutex> lock(*mutex);
    writer = std::make_unique<m::BodyWriter>(enc.encoder, openmetrics, gzip);
  }
  ~Writer() {
    std::lock_guard<std::mutex> lock(*mutex);
    writer.reset();
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  std::shared_ptr<std::mutex> mutex;
  std::unique_ptr<m::BodyWriter> writer;
};

// The reader and its lock: reads from several Python threads take turns.
struct PyReader {
  explicit PyReader(std::string directory) : reader(std::move(directory)) {}
  std::mutex mutex;
  m::MultiprocReader reader;
};

// Triton's parser and its series cache, one per endpoint.
struct PyParser {
  std::mutex mutex;
  m::TextParser parser;
};

FamilyList Reader_Read(PyReader& r) {
  m::MultiprocResult result;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(r.mutex);
    result = r.reader.Read();
  }
  FamilyList out;
  out.families = std::move(result.families);
  out.files = result.files;
  out.corrupt = std::move(result.corrupt);
  return out;
}

FamilyList Parser_Parse(PyParser& p, const py::bytes& body) {
  // The bytes object is immutable and held by the caller for the whole call.
  std::string_view text(PyBytes_AS_STRING(body.ptr()), PyBytes_GET_SIZE(body.ptr()));
  std::vector<m::Family> families;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(p.mutex);
    families = p.parser.Parse(text);
  }
  FamilyList out;
  out.families = std::make_shared<const std::vector<m::Family>>(std::move(families));
  return out;
}

// Python Family objects (runtime.metrics_proxy.exposition): name, type, help, samples of
// (name, ((label, value), ...), value).
std::vector<m::Family> FromPython(const py::iterable& families) {
  std::vector<m::Family> out;
  for (py::handle item : families) {
    m::Family fam{item.attr("name").cast<std::string>(), item.attr("type").cast<std::string>(),
                  item.attr("help").cast<std::string>(), {}};
    for (py::handle s : item.attr("samples")) {
      auto sample = s.cast<py::tuple>();
      if (sample.size() != 3) throw py::value_error("a sample must be (name, labels, value)");
      auto series = std::make_shared<m::Series>(
          m::Series{sample[0].cast<std::string>(), sample[1].cast<m::Labels>()});
      fam.samples.push_back(m::Sample{std::move(series), sample[2].cast<double>()});
    }
    out.push_back(std::move(fam));
  }
  return out;
}

py::list FamilyList_Families(const FamilyList& list) {
  py::list out;
  for (const m::Family& fam : *list.families) {
    py::list samples;
    for (const m::Sample& s : fam.samples) {
      const m::Labels& pairs = s.series->labels;
      py::tuple labels(pairs.size());
      for (size_t i = 0; i < pairs.size(); ++i) {
        labels[i] = py::make_tuple(pairs[i].first, pairs[i].second);
      }
      samples.append(py::make_tuple(s.series->name, labels, s.value));
    }
    out.append(py::make_tuple(fam.name, fam.type, fam.help, samples));
  }
  return out;
}

py::list FamilyList_Names(const FamilyList& list) {
  py::list out;
  for (const m::Family& fam : *list.families) out.append(fam.name);
  return out;
}

void Writer_Reserve(Writer& w, const FamilyList& list) {
  std::lock_guard<std::mutex> lock(*w.mutex);
  w.writer->Reserve(*list.families);
}

int Writer_Add(Writer& w, const FamilyList& list) {
  auto families = list.families;  // kept alive without the GIL
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(*w.mutex);
  return w.writer->Add(*families);
}

void Writer_AddReserved(Writer& w, const FamilyList& list) {
  auto families = list.families;
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(*w.mutex);
  w.writer->AddReserved(*families);
}

py::bytes Writer_Finish(Writer& w) {
  std::string body;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(*w.mutex);
    body = w.writer->Finish();
  }
  return py::bytes(body);
}

// A fetch error raised as runtime.metrics_proxy.triton.TritonScrapeError(reason, message).
[[noreturn]] void RaiseFetchError(const m::FetchError& exc) {
  py::object cls = py::module_::import("runtime.metrics_proxy.triton").attr("TritonScrapeError");
  PyErr_SetObject(cls.ptr(), py::make_tuple(exc.reason, exc.what()).ptr());
  throw py::error_already_set();
}

py::bytes Fetcher_Fetch(m::HttpFetcher& fetcher, std::mutex& mutex) {
  std::string body;
  try {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mutex);
    body = fetcher.Fetch();
  } catch (const m::FetchError& exc) {
    RaiseFetchError(exc);
  }
  return py::bytes(body);
}

struct PyFetcher {
  PyFetcher(std::string host, int port, std::string path, double timeout_s, size_t max_bytes)
      : fetcher(std::move(host), port, std::move(path), timeout_s, max_bytes) {}
  m::HttpFetcher fetcher;
  std::mutex mutex;
};

// The native server and the Python callables it runs. The callables are released with the GIL
// held: after the threads that call them are joined.
struct PyScrapeServer {
  std::shared_ptr<py::function> warn, prepare;
  std::shared_ptr<m::Scraper> scraper;
  std::unique_ptr<m::ScrapeServer> server;

  ~PyScrapeServer() {
    py::gil_scoped_release release;
    server.reset();
    scraper.reset();
  }
};

std::unique_ptr<PyScrapeServer> MakeServer(
    const std::string& host, int port, double reuse_s, double idle_timeout_s,
    const std::string& triton_host, int triton_port, const std::string& triton_path,
    double triton_timeout_s, size_t triton_max_bytes, const std::string& directory,
    m::Labels constant_labels, py::function warn, std::optional<py::function> prepare) {
  auto out = std::make_unique<PyScrapeServer>();
  out->warn = std::make_shared<py::function>(std::move(warn));
  if (prepare) out->prepare = std::make_shared<py::function>(std::move(*prepare));
  // Plain pointers into callables `out` owns: the lambdas never touch a refcount without the
  // GIL, and `out` outlives the threads.
  py::function* warn_fn = out->warn.get();
  py::function* prepare_fn = out->prepare.get();
  auto on_warn = [warn_fn](const std::vector<std::string>& lines) {
    py::gil_scoped_acquire gil;
    for (const std::string& line : lines) {
      try {
        (*warn_fn)(line);
      } catch (py::error_already_set& exc) {
        exc.discard_as_unraisable("metrics proxy: logging a warning");
      }
    }
  };
  std::function<void()> on_prepare;
  if (prepare_fn != nullptr) {
    on_prepare = [prepare_fn] {
      py::gil_scoped_acquire gil;
      try {
        (*prepare_fn)();
      } catch (py::error_already_set& exc) {
        exc.discard_as_unraisable("metrics proxy: before reading the directory");
      }
    };
  }
  auto fetcher = std::make_unique<m::HttpFetcher>(triton_host, triton_port, triton_path,
                                                  triton_timeout_s, triton_max_bytes);
  out->scraper = std::make_shared<m::Scraper>(std::move(fetcher), directory,
                                              std::move(constant_labels), on_warn, on_prepare);
  m::ServerOptions options;
  options.host = host;
  options.port = port;
  options.reuse_s = reuse_s;
  options.idle_timeout_s = idle_timeout_s;
  m::Scraper* scraper = out->scraper.get();
  out->server = std::make_unique<m::ScrapeServer>(
      options, [scraper](const std::vector<int>& formats) { return scraper->Merge(formats); },
      [scraper] { return scraper->Health().Json(); }, [scraper] { scraper->FlushWarnings(); });
  return out;
}

}  // namespace

PYBIND11_MODULE(_metrics, mod) {
  mod.doc() = "The metrics proxy's native merge: .db files, Triton's text, the body and gzip.";

  py::register_exception<m::DirectoryError>(mod, "DirectoryError", PyExc_OSError);
  py::register_exception<m::ParseError>(mod, "ExpositionParseError", PyExc_ValueError);

  py::class_<FamilyList>(mod, "FamilyList", "Families read from the .db files or from Triton.")
      .def_readonly("files", &FamilyList::files, "Files merged (a .db read).")
      .def_property_readonly(
          "corrupt_files",
          [](const FamilyList& l) { return py::tuple(py::cast(l.corrupt)); },
          "'name: reason' per .db file skipped as truncated or corrupt.")
      .def_static(
          "of",
          [](const py::iterable& families) {
            FamilyList out;
            out.families = std::make_shared<const std::vector<m::Family>>(FromPython(families));
            return out;
          },
          py::arg("families"), "A list of Python Family objects, as a source to add().")
      .def("names", &FamilyList_Names, "Family names, in order.")
      .def("families", &FamilyList_Families,
           "Every family as (name, type, help, [(sample, labels, value), ...]).");

  py::class_<PyReader>(mod, "MultiprocReader",
                                 "Merges a PROMETHEUS_MULTIPROC_DIR as MultiProcessCollector.")
      .def(py::init<std::string>(), py::arg("directory"))
      .def("read", &Reader_Read,
           "Merge every *.db file; raises DirectoryError (an OSError) if the directory cannot "
           "be listed.");

  py::class_<PyParser>(mod, "TextParser",
                       "Parses one endpoint's Prometheus text, caching its series.")
      .def(py::init<>())
      .def("parse", &Parser_Parse, py::arg("body"),
           "Parse Prometheus text 0.0.4; raises ExpositionParseError (a ValueError).");

  py::class_<PyEncoder>(mod, "Encoder", "The pod's constant labels and the series text cache.")
      .def(py::init<m::Labels>(), py::arg("constant_labels"));

  py::class_<Writer>(mod, "BodyWriter",
                     "One exposition body: reserve(own), add(source)..., add_reserved(own), "
                     "finish().")
      .def(py::init<const PyEncoder&, bool, bool>(), py::arg("encoder"), py::arg("openmetrics"),
           py::arg("gzip"))
      .def("reserve", &Writer_Reserve, py::arg("families"),
           "Claim these families' names (and sample names) ahead of every source.")
      .def("add", &Writer_Add, py::arg("families"),
           "Write a source's families; returns how many it hid (names an earlier one had).")
      .def("add_reserved", &Writer_AddReserved, py::arg("families"),
           "Write the reserved families.")
      .def("finish", &Writer_Finish, "The body (gzipped if asked); the writer is spent.");

  py::class_<PyFetcher>(mod, "HttpFetcher",
                        "GETs one URL over kept-alive HTTP/1.1 within a time and size bound.")
      .def(py::init<std::string, int, std::string, double, size_t>(), py::arg("host"),
           py::arg("port"), py::arg("path"), py::arg("timeout_s"), py::arg("max_bytes"))
      .def(
          "fetch", [](PyFetcher& f) { return Fetcher_Fetch(f.fetcher, f.mutex); },
          "The body; raises TritonScrapeError(reason, message).");

  mod.def("wants_openmetrics", &m::WantsOpenMetrics, py::arg("accept"),
          "Whether an Accept header prefers OpenMetrics (the server's negotiation).");
  mod.def("wants_gzip", &m::WantsGzip, py::arg("accept_encoding"),
          "Whether an Accept-Encoding header accepts gzip (the server's negotiation).");

  py::class_<PyScrapeServer>(mod, "ScrapeServer",
                             "The proxy's HTTP server: /metrics merged natively, /healthz, each source's health.")
      .def(py::init(&MakeServer), py::arg("host"), py::arg("port"), py::arg("reuse_s"),
           py::arg("idle_timeout_s"), py::arg("triton_host"), py::arg("triton_port"),
           py::arg("triton_path"), py::arg("triton_timeout_s"), py::arg("triton_max_bytes"),
           py::arg("directory"), py::arg("constant_labels"), py::arg("warn"),
           py::arg("prepare"))
      .def(
          "start",
          [](PyScrapeServer& s) {
            py::gil_scoped_release release;
            return s.server->Start();
          },
          "Bind and serve from two native threads; returns the bound port.")
      .def(
          "stop",
          [](PyScrapeServer& s, double grace_s) {
            py::gil_scoped_release release;
            s.server->Stop(grace_s);
          },
          py::arg("grace_s"),
          "Close the listener, answer the scrapes in flight for up to grace_s, then end.");
}
