// Python bindings for the constraint engine: buffer checks and GIL handling in small glue
// functions, then declarations only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llm_serving/batch_engine.h"
#include "llm_serving/catalog_trie.h"
#include "llm_serving/constraint.h"
#include "llm_serving/errors.h"
#include "llm_serving/parallelism.h"
#include "llm_serving/vocab_trie.h"

namespace py = pybind11;

// A Python integer (anything with __index__) as it crosses the boundary: int64, or its text
// when it does not fit, so that the glue's range checks raise ValueError for every out-of-range
// index instead of pybind11's TypeError for some of them.
struct PyInt {
  int64_t value = 0;
  std::string overflow;  // the integer's text when it is beyond int64; empty otherwise
};

namespace pybind11::detail {
template <>
struct type_caster<PyInt> {
  PYBIND11_TYPE_CASTER(PyInt, io_name("typing.SupportsInt | typing.SupportsIndex", "int"));

  bool load(handle src, bool /*convert*/) {
    if (!src || PyFloat_Check(src.ptr())) return false;
    object index = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
    if (!index) {
      PyErr_Clear();
      return false;
    }
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (number == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    value.value = overflow == 0 ? number : 0;
    value.overflow = overflow == 0 ? std::string() : std::string(str(index));
    return true;
  }

  static handle cast(const PyInt& src, return_value_policy /*policy*/, handle /*parent*/) {
    return PyLong_FromLongLong(src.value);
  }
};
}  // namespace pybind11::detail

using llm_serving::BatchEngine;
using llm_serving::CatalogTrie;
using llm_serving::ConfigError;
using llm_serving::Constraint;
using llm_serving::VocabTrie;

namespace {

struct CatalogHandle {
  std::shared_ptr<const CatalogTrie> trie;
};

struct VocabularyHandle {
  std::shared_ptr<const VocabTrie> trie;
};

struct ConstraintHandle {
  std::shared_ptr<const Constraint> constraint;
};

std::string Text(const PyInt& number) {
  return number.overflow.empty() ? std::to_string(number.value) : number.overflow;
}

// `number` as T when lo <= number <= hi; otherwise ConfigError "<what> <number> is not in
// lo..hi".
template <typename T>
T InRange(const PyInt& number, const std::string& what, int64_t lo, int64_t hi) {
  if (!number.overflow.empty() || number.value < lo || number.value > hi) {
    throw ConfigError(what + " " + Text(number) + " is not in " + std::to_string(lo) + ".." +
                      std::to_string(hi));
  }
  return static_cast<T>(number.value);
}

int32_t ToInt32(const PyInt& number, const std::string& what) {
  return InRange<int32_t>(number, what, std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max());
}

uint32_t ToUint32(const PyInt& number, const std::string& what) {
  return InRange<uint32_t>(number, what, 0, std::numeric_limits<uint32_t>::max());
}

std::vector<int32_t> ToInt32s(const std::vector<PyInt>& numbers, const std::string& what) {
  std::vector<int32_t> out;
  out.reserve(numbers.size());
  for (std::size_t i = 0; i < numbers.size(); ++i) {
    out.push_back(ToInt32(numbers[i], what + "[" + std::to_string(i) + "]"));
  }
  return out;
}

template <typename T>
const char* TypeName() {
  return sizeof(T) == 8 ? "int64" : sizeof(T) == 4 ? "int32" : "uint8";
}

// A checked view of a C-contiguous buffer of T with `ndim` dimensions.
template <typename T>
py::buffer_info Checked(const py::buffer& buffer, const char* name, int ndim, bool writable) {
  py::buffer_info info = buffer.request(writable);
  if (!info.item_type_is_equivalent_to<T>()) {
    throw ConfigError(std::string(name) + " must be " + TypeName<T>() + ", got format '" +
                      info.format + "'");
  }
  if (info.ndim != ndim) {
    throw ConfigError(std::string(name) + " must have " + std::to_string(ndim) +
                      " dimension(s), got " + std::to_string(info.ndim));
  }
  py::ssize_t expected = static_cast<py::ssize_t>(sizeof(T));
  for (int d = ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw ConfigError(std::string(name) + " must be C-contiguous");
    }
    expected *= info.shape[d];
  }
  return info;
}

CatalogHandle Catalog_Init(const py::buffer& tokens, const py::buffer& offsets,
                           const PyInt& vocab_size_arg) {
  const int32_t vocab_size = ToInt32(vocab_size_arg, "vocab_size");
  auto t = Checked<int32_t>(tokens, "tokens", 1, false);
  auto o = Checked<int64_t>(offsets, "offsets", 1, false);
  if (o.shape[0] < 2) throw ConfigError("offsets needs at least two entries (one item)");
  const auto* token_ptr = static_cast<const int32_t*>(t.ptr);
  const auto* offset_ptr = static_cast<const int64_t*>(o.ptr);
  const auto num_tokens = static_cast<std::size_t>(t.shape[0]);
  const auto num_items = static_cast<std::size_t>(o.shape[0] - 1);
  py::gil_scoped_release release;
  return {CatalogTrie::Build(token_ptr, num_tokens, offset_ptr, num_items, vocab_size)};
}

// The arguments every constraint builder takes, range-checked.
struct CommonArgs {
  int32_t eos_token_id;
  std::vector<int32_t> banned;
  int32_t vocab_size;
};

CommonArgs Common(const PyInt& eos_token_id, const std::vector<PyInt>& banned,
                  const PyInt& vocab_size) {
  return {ToInt32(eos_token_id, "eos_token_id"), ToInt32s(banned, "banned_tokens"),
          ToInt32(vocab_size, "vocab_size")};
}

// min_items and max_items (None: no limit, passed on as 0).
std::pair<uint32_t, uint32_t> ItemBounds(const PyInt& min_items,
                                         const std::optional<PyInt>& max_items) {
  const uint32_t low = ToUint32(min_items, "min_items");
  if (!max_items.has_value()) return {low, 0};
  const uint32_t high = ToUint32(*max_items, "max_items");
  if (high == 0) throw ConfigError("max_items must be >= 1");
  return {low, high};
}

ConstraintHandle Constraint_ItemList(const CatalogHandle& catalog,
                                     const std::vector<PyInt>& prefix_arg,
                                     const std::vector<PyInt>& separator_arg,
                                     const std::vector<PyInt>& terminator_arg,
                                     const PyInt& min_items_arg,
                                     const std::optional<PyInt>& max_items_arg, bool unique,
                                     const std::optional<py::buffer>& allowed,
                                     const PyInt& eos_token_id, const std::vector<PyInt>& banned,
                                     const PyInt& vocab_size) {
  const auto [min_items, max_items] = ItemBounds(min_items_arg, max_items_arg);
  std::vector<int32_t> prefix = ToInt32s(prefix_arg, "prefix");
  std::vector<int32_t> separator = ToInt32s(separator_arg, "separator");
  std::vector<int32_t> terminator = ToInt32s(terminator_arg, "terminator");
  CommonArgs common = Common(eos_token_id, banned, vocab_size);
  std::optional<py::buffer_info> info;
  if (allowed.has_value()) info = Checked<int32_t>(*allowed, "allowed", 1, false);
  const auto* ptr = info ? static_cast<const int32_t*>(info->ptr) : nullptr;
  const std::size_t count = info ? static_cast<std::size_t>(info->shape[0]) : 0;
  py::gil_scoped_release release;
  return {llm_serving::MakeItemListConstraint(
      catalog.trie, std::move(prefix), std::move(separator), std::move(terminator), min_items,
      max_items, unique, ptr, count, !info.has_value(), common.eos_token_id, common.banned,
      common.vocab_size)};
}

VocabularyHandle Vocabulary_Init(const py::buffer& bytes, const py::buffer& offsets) {
  auto b = Checked<uint8_t>(bytes, "bytes", 1, false);
  auto o = Checked<int64_t>(offsets, "offsets", 1, false);
  if (o.shape[0] < 2) throw ConfigError("offsets needs at least two entries (one token)");
  if (o.shape[0] - 1 > INT32_MAX) throw ConfigError("too many tokens");
  const auto* byte_ptr = static_cast<const uint8_t*>(b.ptr);
  const auto* offset_ptr = static_cast<const int64_t*>(o.ptr);
  const auto num_bytes = static_cast<std::size_t>(b.shape[0]);
  const auto vocab_size = static_cast<int32_t>(o.shape[0] - 1);
  py::gil_scoped_release release;
  return {VocabTrie::Build(byte_ptr, num_bytes, offset_ptr, vocab_size)};
}

std::vector<int32_t> PieceBytes(const py::bytes& piece) {
  const std::string text = piece;
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (unsigned char ch : text) out.push_back(ch);
  return out;
}

ConstraintHandle Constraint_DecodedList(const CatalogHandle& catalog,
                                        const VocabularyHandle& vocabulary,
                                        const py::bytes& prefix, const py::bytes& separator,
                                        const py::bytes& terminator, const PyInt& min_items_arg,
                                        const std::optional<PyInt>& max_items_arg, bool unique,
                                        const std::optional<py::buffer>& allowed,
                                        const PyInt& eos_token_id,
                                        const std::vector<PyInt>& banned,
                                        const PyInt& vocab_size) {
  const auto [min_items, max_items] = ItemBounds(min_items_arg, max_items_arg);
  CommonArgs common = Common(eos_token_id, banned, vocab_size);
  std::optional<py::buffer_info> info;
  if (allowed.has_value()) info = Checked<int32_t>(*allowed, "allowed", 1, false);
  const auto* ptr = info ? static_cast<const int32_t*>(info->ptr) : nullptr;
  const std::size_t count = info ? static_cast<std::size_t>(info->shape[0]) : 0;
  std::vector<int32_t> prefix_bytes = PieceBytes(prefix);
  std::vector<int32_t> separator_bytes = PieceBytes(separator);
  std::vector<int32_t> terminator_bytes = PieceBytes(terminator);
  py::gil_scoped_release release;
  return {llm_serving::MakeDecodedListConstraint(
      catalog.trie, vocabulary.trie, std::move(prefix_bytes), std::move(separator_bytes),
      std::move(terminator_bytes), min_items, max_items, unique, ptr, count, !info.has_value(),
      common.eos_token_id, common.banned, common.vocab_size)};
}

ConstraintHandle Constraint_Machine(const PyInt& num_states, const PyInt& initial_state,
                                    const std::vector<PyInt>& accepting_arg,
                                    const py::buffer& transitions, const PyInt& eos_token_id,
                                    const std::vector<PyInt>& banned, const PyInt& vocab_size) {
  const uint32_t states = ToUint32(num_states, "num_states");
  const uint32_t initial = ToUint32(initial_state, "initial_state");
  std::vector<uint32_t> accepting;
  accepting.reserve(accepting_arg.size());
  for (const PyInt& state : accepting_arg) {
    accepting.push_back(ToUint32(state, "accepting state"));
  }
  CommonArgs common = Common(eos_token_id, banned, vocab_size);
  auto info = Checked<int32_t>(transitions, "transitions", 2, false);
  if (info.shape[1] != 3 && info.shape[0] > 0) {
    throw ConfigError("transitions must have 3 columns (state, token, next_state)");
  }
  const auto* ptr = static_cast<const int32_t*>(info.ptr);
  const auto count = static_cast<std::size_t>(info.shape[0]);
  py::gil_scoped_release release;
  return {llm_serving::MakeMachineConstraint(states, initial, accepting, ptr, count,
                                             common.eos_token_id, common.banned,
                                             common.vocab_size)};
}

ConstraintHandle Constraint_Banned(const PyInt& eos_token_id, const std::vector<PyInt>& banned,
                                   const PyInt& vocab_size) {
  CommonArgs common = Common(eos_token_id, banned, vocab_size);
  return {llm_serving::MakeBannedConstraint(common.eos_token_id, common.banned,
                                            common.vocab_size)};
}

// JSON's [[state, token, next_state], ...] as an int64 array of shape (n, 3) in one pass, or
// None when some row is not a list or tuple of three ints (bool excluded) within int64: the
// schema then validates row by row to say which. Reads Python objects, so it keeps the GIL; it
// calls no Python code, so the lists cannot change under it.
py::object TransitionRows(const py::handle& rows) {
  if (!PyList_Check(rows.ptr())) return py::none();
  const py::ssize_t count = PyList_GET_SIZE(rows.ptr());
  py::array_t<int64_t> out({count, py::ssize_t{3}});
  int64_t* data = out.mutable_data();
  for (py::ssize_t i = 0; i < count; ++i) {
    PyObject* row = PyList_GET_ITEM(rows.ptr(), i);
    const bool sequence = PyList_Check(row) || PyTuple_Check(row);
    if (!sequence || PySequence_Fast_GET_SIZE(row) != 3) return py::none();
    PyObject** items = PySequence_Fast_ITEMS(row);
    for (int k = 0; k < 3; ++k) {
      if (!PyLong_CheckExact(items[k])) return py::none();
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(items[k], &overflow);
      if (overflow != 0) return py::none();
      data[3 * i + k] = value;
    }
  }
  return out;
}

// A slot index for the engine (negative or beyond int64 refused here, too large by the engine).
std::size_t CheckedSlot(const BatchEngine& engine, const PyInt& slot) {
  const bool negative = slot.overflow.empty() ? slot.value < 0 : slot.overflow[0] == '-';
  if (negative) throw ConfigError("slot " + Text(slot) + " is negative");
  if (!slot.overflow.empty()) {
    throw ConfigError("slot " + Text(slot) + " is not in 0.." +
                      std::to_string(engine.max_batch() - 1));
  }
  return static_cast<std::size_t>(slot.value);
}

void Engine_Add(BatchEngine& engine, const PyInt& slot, const ConstraintHandle& constraint) {
  const std::size_t index = CheckedSlot(engine, slot);
  py::gil_scoped_release release;
  engine.Add(index, constraint.constraint);
}

void Engine_Advance(BatchEngine& engine, const PyInt& slot, const std::vector<PyInt>& tokens) {
  const std::size_t index = CheckedSlot(engine, slot);
  const std::vector<int32_t> ids = ToInt32s(tokens, "tokens");
  py::gil_scoped_release release;
  engine.Advance(index, ids.data(), ids.size());
}

void Engine_AdvanceBatch(BatchEngine& engine, const py::buffer& slots, const py::buffer& tokens) {
  auto s = Checked<int32_t>(slots, "slots", 1, false);
  auto t = Checked<int32_t>(tokens, "tokens", 1, false);
  if (s.shape[0] != t.shape[0]) {
    throw ConfigError("slots and tokens must have the same length, got " +
                      std::to_string(s.shape[0]) + " and " + std::to_string(t.shape[0]));
  }
  py::gil_scoped_release release;
  engine.AdvanceBatch(static_cast<const int32_t*>(s.ptr), static_cast<const int32_t*>(t.ptr),
                      static_cast<std::size_t>(s.shape[0]));
}

void Engine_Fill(BatchEngine& engine, const py::buffer& bitmask, const py::buffer& rows,
                 bool wait) {
  auto b = Checked<int32_t>(bitmask, "bitmask", 2, true);
  auto r = Checked<int32_t>(rows, "rows", 1, false);
  if (static_cast<std::size_t>(b.shape[1]) != engine.words()) {
    throw ConfigError("bitmask must have " + std::to_string(engine.words()) +
                      " int32 words per row (ceil(vocab_size / 32)), got " +
                      std::to_string(b.shape[1]));
  }
  auto* ptr = static_cast<int32_t*>(b.ptr);
  const auto num_rows = static_cast<std::size_t>(b.shape[0]);
  const auto* row_ptr = static_cast<const int32_t*>(r.ptr);
  const auto count = static_cast<std::size_t>(r.shape[0]);
  if (wait) {
    py::gil_scoped_release release;
    engine.Fill(ptr, num_rows, row_ptr, count);
    return;
  }
  // The engine keeps the bitmask's owner until the fill is waited for, so a buffer dropped
  // early (by any thread) is never written after it is freed. Holders are created and released
  // here, with the GIL held; the engine only moves them.
  std::shared_ptr<void> keep = std::make_shared<py::object>(bitmask);
  std::shared_ptr<void> finished;
  {
    py::gil_scoped_release release;
    finished = engine.FillAsync(ptr, num_rows, row_ptr, count, keep);
  }
}

// One step of the listed slots against their output-token lists (GIL held while the lists are
// read, released while the engine runs): a list shorter than what its slot consumed resets the
// slot, new tokens are advanced up to the first placeholder (-1), then the row is filled, a row
// stopped at a placeholder only with `fill_waiting`. Writes the rows whose tokens are all known,
// then the others, into `order` and returns how many are ready. With `wait` false the step runs
// on the engine's threads, which keep `bitmask` referenced until it is waited for. `consumed` and
// `order` are written only once every row is checked and the engine accepted the step, so a
// refused call leaves them as they were (tokens counted as consumed were advanced).
py::ssize_t Engine_Step(BatchEngine& engine, const py::list& outputs, const py::buffer& rows,
                        const py::buffer& consumed, const py::buffer& order,
                        const py::buffer& bitmask, bool fill_waiting, bool wait) {
  auto r = Checked<int32_t>(rows, "rows", 1, false);
  auto c = Checked<int64_t>(consumed, "consumed", 1, true);
  auto o = Checked<int32_t>(order, "order", 1, true);
  auto b = Checked<int32_t>(bitmask, "bitmask", 2, true);
  if (static_cast<std::size_t>(b.shape[1]) != engine.words()) {
    throw ConfigError("bitmask must have " + std::to_string(engine.words()) +
                      " int32 words per row (ceil(vocab_size / 32)), got " +
                      std::to_string(b.shape[1]));
  }
  const auto count = static_cast<std::size_t>(r.shape[0]);
  if (o.shape[0] < r.shape[0]) {
    throw ConfigError("order must hold " + std::to_string(count) + " rows, got " +
                      std::to_string(o.shape[0]));
  }
  const auto* row_ptr = static_cast<const int32_t*>(r.ptr);
  auto* consumed_ptr = static_cast<int64_t*>(c.ptr);
  auto* order_ptr = static_cast<int32_t*>(o.ptr);
  const auto limit = std::min<py::ssize_t>(py::len(outputs), c.shape[0]);
  llm_serving::StepPlan plan;
  plan.slots.reserve(count);
  plan.reset.reserve(count);
  plan.fill.reserve(count);
  plan.begin.reserve(count + 1);
  plan.tokens.reserve(count);
  std::vector<int64_t> new_consumed;  // per listed row, committed after the engine's checks
  new_consumed.reserve(count);
  std::vector<int32_t> ready_rows;
  std::vector<int32_t> waiting;
  for (std::size_t i = 0; i < count; ++i) {
    const int32_t row = row_ptr[i];
    if (row < 0 || row >= limit) {
      throw ConfigError("row " + std::to_string(row) + " is outside the " +
                        std::to_string(limit) + " output lists");
    }
    PyObject* list = PyList_GET_ITEM(outputs.ptr(), row);
    if (!PyList_Check(list)) {
      throw ConfigError("outputs[" + std::to_string(row) + "] must be a list");
    }
    const py::ssize_t size = PyList_GET_SIZE(list);
    // A count beyond the list is legitimate (tokens were discarded: the list is replayed from
    // the start); a negative one is not, and would index the list before its first item.
    const int64_t previous = consumed_ptr[row];
    if (previous < 0) {
      const std::string index = std::to_string(row);
      throw ConfigError("consumed[" + index + "] must be >= 0 (the tokens of outputs[" + index +
                        "] already consumed), got " + std::to_string(previous));
    }
    const bool reset = previous > static_cast<int64_t>(size);
    py::ssize_t next = reset ? 0 : static_cast<py::ssize_t>(previous);
    for (; next < size; ++next) {
      const long long token = PyLong_AsLongLong(PyList_GET_ITEM(list, next));
      if (token == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (token == -1) break;
      if (token < std::numeric_limits<int32_t>::min() ||
          token > std::numeric_limits<int32_t>::max()) {
        throw ConfigError("token " + std::to_string(token) + " of outputs[" +
                          std::to_string(row) + "] is not an int32");
      }
      plan.tokens.push_back(static_cast<int32_t>(token));
    }
    new_consumed.push_back(next);
    const bool known = next == size;
    plan.slots.push_back(row);
    plan.reset.push_back(reset ? 1 : 0);
    plan.fill.push_back(known || fill_waiting ? 1 : 0);
    plan.begin.push_back(plan.tokens.size());
    (known ? ready_rows : waiting).push_back(row);
  }
  auto* bitmask_ptr = static_cast<int32_t*>(b.ptr);
  const auto num_rows = static_cast<std::size_t>(b.shape[0]);
  // The engine refuses a duplicate, inactive or out-of-bitmask slot before running anything,
  // so committing after its call keeps a refused step from touching `consumed` and `order`.
  const auto commit = [&] {
    for (std::size_t i = 0; i < count; ++i) consumed_ptr[row_ptr[i]] = new_consumed[i];
    std::copy(ready_rows.begin(), ready_rows.end(), order_ptr);
    std::copy(waiting.begin(), waiting.end(), order_ptr + ready_rows.size());
  };
  const auto ready = static_cast<py::ssize_t>(ready_rows.size());
  if (wait) {
    {
      py::gil_scoped_release release;
      engine.Step(std::move(plan), bitmask_ptr, num_rows);
    }
    commit();
    return ready;
  }
  // As in Engine_Fill: the engine holds the bitmask's owner until the step is waited for.
  std::shared_ptr<void> keep = std::make_shared<py::object>(bitmask);
  std::shared_ptr<void> finished;
  {
    py::gil_scoped_release release;
    finished = engine.StepAsync(std::move(plan), bitmask_ptr, num_rows, keep);
  }
  commit();
  return ready;
}

// `logits` is the address of a C-contiguous float32 [num_rows, columns] CPU buffer: the Python
// wrapper takes it from a tensor it checked, which spares converting the tensor every step.
void Engine_MaskLogits(BatchEngine& engine, std::uintptr_t logits, const PyInt& num_rows,
                       const PyInt& columns, const py::buffer& bitmask, const py::buffer& rows) {
  const auto n = InRange<std::size_t>(num_rows, "num_rows", 0, std::numeric_limits<int64_t>::max());
  const auto width =
      InRange<std::size_t>(columns, "columns", 0, std::numeric_limits<int64_t>::max());
  auto b = Checked<int32_t>(bitmask, "bitmask", 2, false);
  auto r = Checked<int32_t>(rows, "rows", 1, false);
  if (static_cast<std::size_t>(b.shape[1]) != engine.words()) {
    throw ConfigError("bitmask must have " + std::to_string(engine.words()) +
                      " int32 words per row (ceil(vocab_size / 32)), got " +
                      std::to_string(b.shape[1]));
  }
  if (logits == 0 && n != 0) throw ConfigError("logits is a null address");
  auto* logits_ptr = reinterpret_cast<float*>(logits);
  const auto* bitmask_ptr = static_cast<const int32_t*>(b.ptr);
  const auto bitmask_rows = static_cast<std::size_t>(b.shape[0]);
  const auto* row_ptr = static_cast<const int32_t*>(r.ptr);
  const auto count = static_cast<std::size_t>(r.shape[0]);
  py::gil_scoped_release release;
  engine.MaskLogits(logits_ptr, n, width, bitmask_ptr, bitmask_rows, row_ptr, count);
}

void Engine_Wait(BatchEngine& engine) {
  std::shared_ptr<void> finished;
  py::gil_scoped_release release;
  finished = engine.Wait();
}

py::dict Engine_SlotInfo(BatchEngine& engine, const PyInt& slot) {
  const std::size_t index = CheckedSlot(engine, slot);
  llm_serving::SlotInfo state;
  {
    py::gil_scoped_release release;
    state = engine.Info(index);
  }
  py::dict info;
  info["dead_ends"] = state.dead_ends;
  info["rejected_tokens"] = state.rejected_tokens;
  info["finished"] = state.finished;
  return info;
}

uint64_t Engine_TotalDeadEnds(BatchEngine& engine) {
  py::gil_scoped_release release;
  return engine.total_dead_ends();
}

bool Engine_Active(BatchEngine& engine, const PyInt& slot) {
  const std::size_t index = CheckedSlot(engine, slot);
  py::gil_scoped_release release;
  return engine.active(index);
}

template <void (BatchEngine::*Method)(std::size_t)>
void Engine_SlotCall(BatchEngine& engine, const PyInt& slot) {
  const std::size_t index = CheckedSlot(engine, slot);
  py::gil_scoped_release release;
  (engine.*Method)(index);
}

template <void (BatchEngine::*Method)(std::size_t, std::size_t)>
void Engine_PairCall(BatchEngine& engine, const PyInt& a, const PyInt& b) {
  const std::size_t first = CheckedSlot(engine, a);
  const std::size_t second = CheckedSlot(engine, b);
  py::gil_scoped_release release;
  (engine.*Method)(first, second);
}

std::unique_ptr<BatchEngine> Engine_Init(const PyInt& max_batch, const PyInt& vocab_size,
                                         const PyInt& num_threads) {
  if (max_batch.overflow.empty() && max_batch.value <= 0) {
    throw ConfigError("max_batch must be at least 1");
  }
  if (num_threads.overflow.empty() && num_threads.value <= 0) {
    throw ConfigError("num_threads must be at least 1");
  }
  // Rows cross as int32, so a larger batch could never be filled.
  const auto batch = InRange<std::size_t>(max_batch, "max_batch", 1,
                                          std::numeric_limits<int32_t>::max());
  const auto threads = InRange<std::size_t>(num_threads, "num_threads", 1,
                                            std::numeric_limits<int32_t>::max());
  const int32_t vocab = ToInt32(vocab_size, "vocab_size");
  py::gil_scoped_release release;
  return std::make_unique<BatchEngine>(batch, vocab, threads);
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "Native constraint engine of llm-serving.";
  m.attr("__version__") = LLM_SERVING_VERSION;
  m.attr("THREADS_ENV_VAR") = llm_serving::kThreadsEnvVar;
  m.def("default_num_threads", &llm_serving::DefaultNumThreads,
        "Worker threads the engine uses: LLM_SERVING_ENGINE_THREADS, else the core count.");
  m.def("transition_rows", &TransitionRows, py::arg("rows"),
        "Rows of three ints (lists or tuples) as an int64 array (n, 3); None when one is not.");

  py::register_exception<llm_serving::ConfigError>(m, "EngineConfigError", PyExc_ValueError);
  py::register_exception<llm_serving::StateError>(m, "EngineStateError", PyExc_RuntimeError);

  py::class_<CatalogHandle>(m, "Catalog", "An immutable compiled catalog trie.")
      .def(py::init(&Catalog_Init), py::arg("tokens"), py::arg("offsets"), py::arg("vocab_size"))
      .def_property_readonly("num_items", [](const CatalogHandle& c) { return c.trie->num_items(); })
      .def_property_readonly("num_tokens",
                             [](const CatalogHandle& c) { return c.trie->num_tokens(); })
      .def_property_readonly("num_nodes", [](const CatalogHandle& c) { return c.trie->num_nodes(); })
      .def_property_readonly("vocab_size",
                             [](const CatalogHandle& c) { return c.trie->vocab_size(); })
      .def_property_readonly("memory_bytes",
                             [](const CatalogHandle& c) { return c.trie->MemoryBytes(); });

  py::class_<VocabularyHandle>(m, "Vocabulary",
                               "The decoded bytes of every token, compiled into a byte trie.")
      .def(py::init(&Vocabulary_Init), py::arg("bytes"), py::arg("offsets"))
      .def_property_readonly("vocab_size",
                             [](const VocabularyHandle& v) { return v.trie->vocab_size(); })
      .def_property_readonly("num_nodes",
                             [](const VocabularyHandle& v) { return v.trie->num_nodes(); })
      .def_property_readonly("max_token_length",
                             [](const VocabularyHandle& v) { return v.trie->max_token_length(); })
      .def_property_readonly("memory_bytes",
                             [](const VocabularyHandle& v) { return v.trie->MemoryBytes(); });

  py::class_<ConstraintHandle>(m, "Constraint", "One request's compiled constraint.")
      .def_static("item_list", &Constraint_ItemList, py::arg("catalog"), py::arg("prefix"),
                  py::arg("separator"), py::arg("terminator"), py::arg("min_items"),
                  py::arg("max_items"), py::arg("unique"), py::arg("allowed"),
                  py::arg("eos_token_id"), py::arg("banned"), py::arg("vocab_size"))
      .def_static("decoded_item_list", &Constraint_DecodedList, py::arg("catalog"),
                  py::arg("vocabulary"), py::arg("prefix"), py::arg("separator"),
                  py::arg("terminator"), py::arg("min_items"), py::arg("max_items"),
                  py::arg("unique"), py::arg("allowed"), py::arg("eos_token_id"),
                  py::arg("banned"), py::arg("vocab_size"))
      .def_static("token_machine", &Constraint_Machine, py::arg("num_states"),
                  py::arg("initial_state"), py::arg("accepting"), py::arg("transitions"),
                  py::arg("eos_token_id"), py::arg("banned"), py::arg("vocab_size"))
      .def_static("banned", &Constraint_Banned, py::arg("eos_token_id"), py::arg("banned"),
                  py::arg("vocab_size"));

  py::class_<BatchEngine>(m, "Engine", "Request slots and the batched bitmask fill.")
      .def(py::init(&Engine_Init), py::arg("max_batch"), py::arg("vocab_size"),
           py::arg("num_threads"))
      .def_property_readonly("max_batch", &BatchEngine::max_batch)
      .def_property_readonly("vocab_size", &BatchEngine::vocab_size)
      .def_property_readonly("words", &BatchEngine::words)
      .def_property_readonly("num_threads", &BatchEngine::num_threads)
      .def("add", &Engine_Add, py::arg("slot"), py::arg("constraint"))
      .def("remove", &Engine_SlotCall<&BatchEngine::Remove>, py::arg("slot"))
      .def("reset", &Engine_SlotCall<&BatchEngine::Reset>, py::arg("slot"))
      .def("move", &Engine_PairCall<&BatchEngine::Move>, py::arg("source"), py::arg("target"))
      .def("swap", &Engine_PairCall<&BatchEngine::Swap>, py::arg("a"), py::arg("b"))
      .def("advance", &Engine_Advance, py::arg("slot"), py::arg("tokens"))
      .def("advance_batch", &Engine_AdvanceBatch, py::arg("slots"), py::arg("tokens"))
      .def("fill", &Engine_Fill, py::arg("bitmask"), py::arg("rows"), py::arg("wait") = true)
      .def("wait", &Engine_Wait)
      .def("step", &Engine_Step, py::arg("outputs"), py::arg("rows"), py::arg("consumed"),
           py::arg("order"), py::arg("bitmask"), py::arg("fill_waiting"), py::arg("wait"))
      .def("mask_logits", &Engine_MaskLogits, py::arg("logits"), py::arg("num_rows"),
           py::arg("columns"), py::arg("bitmask"), py::arg("rows"))
      .def("active", &Engine_Active, py::arg("slot"))
      .def("slot_info", &Engine_SlotInfo, py::arg("slot"))
      .def_property_readonly("total_dead_ends", &Engine_TotalDeadEnds);
}
