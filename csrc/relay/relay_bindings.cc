// Python bindings for the port gate's relay: every call releases the GIL (the relay thread
// never takes it), and socket errors become OSError with their errno.
#include <pybind11/pybind11.h>

#include <string>
#include <system_error>

#include "relay.h"

namespace py = pybind11;
using llm_serving::relay::Relay;

PYBIND11_MODULE(_relay, m) {
  m.doc() = "The port gate's native byte relay (epoll and splice in its own thread).";

  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const std::system_error& exc) {
      // OSError(errno, text) picks the subclass (ConnectionRefusedError, ...) from errno.
      py::object oserror = py::reinterpret_borrow<py::object>(PyExc_OSError);
      py::object value = oserror(exc.code().value(), exc.what());
      PyErr_SetObject(PyExc_OSError, value.ptr());
    }
  });

  py::class_<Relay>(m, "Relay", "A closed-until-opened TCP relay to one upstream address.")
      .def(py::init<const std::string&, int, bool>(), py::arg("upstream_host"),
           py::arg("upstream_port"), py::arg("splice") = true,
           py::call_guard<py::gil_scoped_release>(),
           "Resolve the upstream address and start the relay thread; splice=False copies bulk "
           "data through user space instead of splice().")
      .def("open", &Relay::Open, py::arg("host"), py::arg("port"), py::arg("backlog") = 1024,
           py::call_guard<py::gil_scoped_release>(),
           "Bind and listen on every address of host; returns the bound port.")
      .def("stop_accepting", &Relay::StopAccepting, py::call_guard<py::gil_scoped_release>(),
           "Close the listening sockets; relayed connections stay up.")
      .def("close_connections", &Relay::CloseConnections,
           py::call_guard<py::gil_scoped_release>(), "Close every relayed connection.")
      .def("close", &Relay::Close, py::call_guard<py::gil_scoped_release>(),
           "Close everything and stop the relay thread.")
      .def_property_readonly("accepting", &Relay::accepting,
                             "Whether the public port is listening.")
      .def_property_readonly("connections", &Relay::connections,
                             "How many connections are being relayed.");
}
