// kdactl_host: the eager prefill's planned path in C++ (a CPython extension over torch's tensors).
//
// kdactl.kda.plans keeps what validating and routing one call decided under the call's metadata;
// this module holds that table and runs a planned call in one native step: the key (every tensor's
// shape, dtype, device, contiguity and the options), the per-call checks (16-byte alignment, the
// host copy of cu_seqlens, the workspace already bound to this stream or capture), the outputs,
// the KdaArgs pointers and the route's C launcher. A call it cannot finish here (a miss, a check
// that fails, anything unusual) returns None and takes the Python full path, which validates it
// and raises the ValueError naming what is wrong, then remembers its plan here.
//
// No CUDA or c10_cuda here: the current device and stream come from the callables `configure`
// gives (torch's own raw accessors), so the module builds and is tested against a CPU-only torch.
//
// What Python and this module must agree on (the call's fields' order, the args struct's size, the
// ABI version, the table's bound) is checked once by `check_abi` against kdactl.kernel_abi, and
// `configure` refuses to run before that check has passed.
#include <Python.h>

#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "kdactl_api.h"

namespace {

// The fields of a call (kdactl.kda.call.PrefillCall, a tuple) this module reads: its tensors, then
// out, cu_seqlens_cpu and workspace.
enum Slot { Q, K, V, G, BETA, INITIAL, CU, A_LOG, DT_BIAS, POOL, INDICES, OUT, CU_CPU, WORKSPACE };
// Each slot's name, in Slot order: kdactl.kernel_abi.CALL_FIELDS must list the same.
constexpr const char* kSlotNames[] = {"q",       "k",          "v",          "g",
                                      "beta",    "initial_state", "cu_seqlens", "A_log",
                                      "dt_bias", "state_pool", "state_indices", "out",
                                      "cu_seqlens_cpu", "workspace"};
constexpr int kCallSlots = sizeof(kSlotNames) / sizeof(kSlotNames[0]);
constexpr int kTensorSlots = INDICES + 1;  // the call's tensors: the plan's key reads each one
static_assert(kCallSlots == WORKSPACE + 1, "kSlotNames: one name per Slot");
constexpr size_t kMaxPlans = 1024;  // more and the table starts over
bool g_abi_checked = false;         // check_abi has passed
constexpr int64_t kNone = -1, kOutNone = -2, kOutTensor = -3, kOutPair = -4;

using Launcher = int (*)(const kdactl_kda_args*, void*);
using CaptureId = int (*)(void*, unsigned long long*);

struct Plan {
  std::vector<int64_t> meta;
  PyObject* options = nullptr;  // owned
  PyObject* launch = nullptr;   // owned: the Python LaunchPlan, which names the route in errors
  kdactl_kda_args args{};
  Launcher launcher = nullptr;
  uint64_t need = 0;            // workspace bytes
  int64_t device = 0;           // q's device index
  int64_t seqlen = 0;           // T: the host bounds end there
  std::vector<int64_t> state_shape;  // the final state to allocate ([N, H, ...]); empty: none
};

std::unordered_multimap<size_t, Plan> g_plans;
PyObject* g_stream_of = nullptr;       // device index -> raw cudaStream_t of its current stream
PyObject* g_current_device = nullptr;  // () -> the current device index
CaptureId g_capture_id = nullptr;      // kdactl_stream_capture_id of the kernel library

// Exactly a torch.Tensor (THPVariable_CheckExact also takes nn.Parameter; the Python table does not).
bool is_tensor(PyObject* x) { return Py_TYPE(x) == reinterpret_cast<PyTypeObject*>(THPVariableClass); }

// Metadata of one argument; false when the call cannot be planned (not exactly a torch.Tensor).
bool add_tensor(PyObject* x, std::vector<int64_t>& meta, bool& aligned) {
  if (x == Py_None) {
    meta.push_back(kNone);
    return true;
  }
  if (!is_tensor(x)) return false;
  const at::Tensor& t = THPVariable_Unpack(x);
  meta.push_back(t.dim());
  for (int64_t s : t.sizes()) meta.push_back(s);
  meta.push_back(static_cast<int64_t>(t.scalar_type()));
  meta.push_back(static_cast<int64_t>(t.device().type()));
  meta.push_back(t.device().index());
  meta.push_back(t.is_contiguous());
  if (t.numel() && (reinterpret_cast<uintptr_t>(t.const_data_ptr()) & 15)) aligned = false;
  return true;
}

// The call's metadata: the tensors in slot order, then `out` (None, o, or (o, final_state)).
bool call_meta(PyObject* const* tensors, PyObject* out, std::vector<int64_t>& meta, bool& aligned) {
  meta.reserve(96);
  for (int i = 0; i < kTensorSlots; ++i)
    if (!add_tensor(tensors[i], meta, aligned)) return false;
  if (out == Py_None) {
    meta.push_back(kOutNone);
  } else if (PyTuple_CheckExact(out) && PyTuple_GET_SIZE(out) == 2) {
    meta.push_back(kOutPair);
    if (!add_tensor(PyTuple_GET_ITEM(out, 0), meta, aligned) || !add_tensor(PyTuple_GET_ITEM(out, 1), meta, aligned))
      return false;
  } else {
    meta.push_back(kOutTensor);
    if (!add_tensor(out, meta, aligned)) return false;
  }
  return true;
}

size_t hash_of(const std::vector<int64_t>& meta, Py_hash_t options_hash) {
  size_t h = static_cast<size_t>(options_hash);
  for (int64_t x : meta) h = h * 1000003u ^ static_cast<size_t>(x);
  return h;
}

Plan* find(size_t h, const std::vector<int64_t>& meta, PyObject* options) {
  auto range = g_plans.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second.meta != meta) continue;
    int same = PyObject_RichCompareBool(it->second.options, options, Py_EQ);
    if (same < 0) {
      PyErr_Clear();
      return nullptr;
    }
    if (same) return &it->second;
  }
  return nullptr;
}

void release(Plan& p) {
  Py_CLEAR(p.options);
  Py_CLEAR(p.launch);
}

void forget_all() {
  for (auto& entry : g_plans) release(entry.second);
  g_plans.clear();
}

// An int attribute or None (-> `none`); false when it is neither.
bool int_or_none(PyObject* obj, const char* name, long long none, long long& value) {
  PyObject* x = PyObject_GetAttrString(obj, name);
  if (!x) {
    PyErr_Clear();
    return false;
  }
  bool ok = true;
  if (x == Py_None) {
    value = none;
  } else if (PyLong_CheckExact(x)) {
    value = PyLong_AsLongLong(x);
  } else {
    ok = false;
  }
  Py_DECREF(x);
  return ok && !PyErr_Occurred();
}

// The host copy of cu_seqlens as prefill checks it: `n` entries, from 0 to seqlen, non-decreasing
// (tests/kda_plan_cases.py runs this and kdactl.kda.plans.bounds_ok on one table of cases).
bool bounds_ok(PyObject* cu_cpu, Py_ssize_t n, int64_t seqlen) {
  std::vector<int64_t> b(static_cast<size_t>(n));
  if (PyList_CheckExact(cu_cpu) || PyTuple_CheckExact(cu_cpu)) {
    if (PySequence_Fast_GET_SIZE(cu_cpu) != n) return false;
    PyObject** items = PySequence_Fast_ITEMS(cu_cpu);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyLong_CheckExact(items[i])) return false;  // bool is not an exact int
      int overflow = 0;
      b[i] = PyLong_AsLongLongAndOverflow(items[i], &overflow);
      if (overflow) return false;
    }
  } else if (is_tensor(cu_cpu)) {
    const at::Tensor& t = THPVariable_Unpack(cu_cpu);
    if (!t.device().is_cpu() || t.dim() != 1 || t.numel() != n || !t.is_contiguous()) return false;
    if (t.scalar_type() == at::kInt) {
      const int32_t* p = t.const_data_ptr<int32_t>();
      for (Py_ssize_t i = 0; i < n; ++i) b[i] = p[i];
    } else if (t.scalar_type() == at::kLong) {
      std::memcpy(b.data(), t.const_data_ptr<int64_t>(), sizeof(int64_t) * n);
    } else {
      return false;
    }
  } else {
    return false;
  }
  if (b.front() != 0 || b.back() != seqlen) return false;
  for (Py_ssize_t i = 0; i + 1 < n; ++i)
    if (b[i + 1] < b[i]) return false;
  return true;
}

long long call_long(PyObject* fn, PyObject* arg) {
  PyObject* r = arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
  if (!r) return -1;
  long long v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return v;
}

// The workspace's scratch pointer for a call on `stream`: only the state its Python claim leaves
// after the first use (bound to this stream, or owned by this capture) and a buffer large enough.
// Anything else (first use, another stream, a capture to bind, a buffer to grow) is the Python
// path's (KdaWorkspace.claim and reserve keep the rules).
bool workspace_ready(PyObject* ws, const Plan& p, void* stream, void** ptr, uint64_t* bytes) {
  PyObject* device = PyObject_GetAttrString(ws, "device");
  if (!device) return PyErr_Clear(), false;
  long long index = -2;
  bool same_device = int_or_none(device, "index", -1, index) && index == p.device;
  Py_DECREF(device);
  long long bound = -1, owner = 0;  // stream None: unbound (-1; the default stream is 0)
  if (!same_device || !int_or_none(ws, "stream", -1, bound) || !int_or_none(ws, "capture_id", 0, owner)) return false;
  unsigned long long capture = 0;
  if (!g_capture_id || g_capture_id(stream, &capture) != 0) return false;
  if (capture ? owner != static_cast<long long>(capture) : (owner != 0 || bound != reinterpret_cast<long long>(stream)))
    return false;
  *ptr = nullptr, *bytes = 0;
  if (!p.need) return true;
  PyObject* buffer = PyObject_GetAttrString(ws, "buffer");
  if (!buffer) return PyErr_Clear(), false;
  bool ok = THPVariable_Check(buffer);
  if (ok) {
    const at::Tensor& t = THPVariable_Unpack(buffer);
    ok = static_cast<uint64_t>(t.numel()) >= p.need;
    *ptr = const_cast<void*>(t.const_data_ptr());
    *bytes = static_cast<uint64_t>(t.numel());
  }
  Py_DECREF(buffer);
  return ok;
}

void* ptr_of(PyObject* x) {
  return x == Py_None ? nullptr : const_cast<void*>(THPVariable_Unpack(x).const_data_ptr());
}

// Whether `call` is a tuple with at least the fields of Slot (a PrefillCall).
bool is_call(PyObject* call) { return PyTuple_Check(call) && PyTuple_GET_SIZE(call) >= kCallSlots; }

// run(options, call) -> (o, final_state or pool or None) when planned and launched; [rc,
// launch_plan] when the launcher returned an error; None otherwise.
PyObject* run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!g_stream_of) Py_RETURN_NONE;  // not configured: every call takes the Python path
  if (nargs != 2 || !is_call(args[1])) {
    PyErr_SetString(PyExc_TypeError, "kdactl_host.run(options, call: a PrefillCall)");
    return nullptr;
  }
  PyObject* options = args[0];
  PyObject* const* t = &PyTuple_GET_ITEM(args[1], 0);
  PyObject *out = t[OUT], *cu_cpu = t[CU_CPU], *ws = t[WORKSPACE];
  std::vector<int64_t> meta;
  bool aligned = true;
  if (!call_meta(t, out, meta, aligned) || !aligned) Py_RETURN_NONE;
  Py_hash_t oh = PyObject_Hash(options);
  if (oh == -1) return PyErr_Clear(), Py_NewRef(Py_None);
  Plan* p = find(hash_of(meta, oh), meta, options);
  if (!p) Py_RETURN_NONE;
  if (cu_cpu != Py_None && !bounds_ok(cu_cpu, THPVariable_Unpack(t[CU]).numel(), p->seqlen)) Py_RETURN_NONE;
  if (call_long(g_current_device, nullptr) != p->device) return PyErr_Clear(), Py_NewRef(Py_None);
  PyObject* device = PyLong_FromLongLong(p->device);
  long long stream_value = call_long(g_stream_of, device);
  Py_DECREF(device);
  if (PyErr_Occurred()) return PyErr_Clear(), Py_NewRef(Py_None);
  void* stream = reinterpret_cast<void*>(stream_value);

  kdactl_kda_args a = p->args;
  at::Tensor scratch;
  const at::Tensor& q = THPVariable_Unpack(t[Q]);
  if (ws != Py_None) {
    if (!workspace_ready(ws, *p, stream, &a.workspace, &a.workspace_bytes)) Py_RETURN_NONE;
  } else if (p->need) {
    scratch = at::empty({static_cast<int64_t>(p->need)}, q.options().dtype(at::kByte));
    a.workspace = scratch.mutable_data_ptr(), a.workspace_bytes = p->need;
  }
  // The outputs: taken from `out` (its metadata is the plan's: borrowed), else allocated as the
  // full path allocates them.
  PyObject *o_given = nullptr, *state_given = nullptr;
  at::Tensor o_new, state_new;
  if (out != Py_None) {
    bool pair = PyTuple_CheckExact(out);
    o_given = pair ? PyTuple_GET_ITEM(out, 0) : out;
    if (pair && PyTuple_GET_ITEM(out, 1) != Py_None) state_given = PyTuple_GET_ITEM(out, 1);
  } else {
    o_new = at::empty(THPVariable_Unpack(t[V]).sizes(), q.options());
  }
  if (t[POOL] != Py_None) {
    state_given = t[POOL];
  } else if (!state_given && !p->state_shape.empty()) {
    state_new = at::empty(p->state_shape, q.options().dtype(at::kFloat));
  }
  a.q = ptr_of(t[Q]), a.k = ptr_of(t[K]), a.v = ptr_of(t[V]), a.g = ptr_of(t[G]), a.beta = ptr_of(t[BETA]);
  a.initial_state = static_cast<const float*>(ptr_of(t[POOL] != Py_None ? t[POOL] : t[INITIAL]));
  a.o = o_given ? ptr_of(o_given) : o_new.mutable_data_ptr();
  a.final_state = static_cast<float*>(state_given ? ptr_of(state_given)
                                                  : state_new.defined() ? state_new.mutable_data_ptr() : nullptr);
  a.cu_seqlens = ptr_of(t[CU]);
  a.A_log = static_cast<const float*>(ptr_of(t[A_LOG]));
  a.dt_bias = static_cast<const float*>(ptr_of(t[DT_BIAS]));
  a.state_indices = static_cast<const int32_t*>(ptr_of(t[INDICES]));
  a.checkpoints = nullptr;
  if (int rc = p->launcher(&a, stream)) return Py_BuildValue("[iO]", rc, p->launch);
  PyObject* result = PyTuple_New(2);
  if (!result) return nullptr;
  PyTuple_SET_ITEM(result, 0, o_given ? Py_NewRef(o_given) : THPVariable_Wrap(o_new));
  PyTuple_SET_ITEM(result, 1, state_given  ? Py_NewRef(state_given)
                              : state_new.defined() ? THPVariable_Wrap(state_new)
                                                    : Py_NewRef(Py_None));
  return result;
  END_HANDLE_TH_ERRORS
}

// remember(options, call, args_bytes, launcher, need, device, seqlen, state_shape, launch_plan): keep
// the plan the full path made for a call (state_shape: the final state to allocate when `out` gives
// none, () for none).
PyObject* remember(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9 || !is_call(args[1]) || !PyBytes_CheckExact(args[2]) ||
      PyBytes_GET_SIZE(args[2]) != sizeof(kdactl_kda_args) || !PyTuple_CheckExact(args[7])) {
    PyErr_SetString(PyExc_TypeError, "kdactl_host.remember: bad arguments (KdaArgs bytes must match kdactl_api.h)");
    return nullptr;
  }
  std::vector<int64_t> meta;
  bool aligned = true;
  PyObject* const* t = &PyTuple_GET_ITEM(args[1], 0);
  if (!call_meta(t, t[OUT], meta, aligned)) Py_RETURN_FALSE;
  Py_hash_t oh = PyObject_Hash(args[0]);
  if (oh == -1) return PyErr_Clear(), Py_NewRef(Py_False);
  Plan p;
  p.meta = std::move(meta);
  std::memcpy(&p.args, PyBytes_AS_STRING(args[2]), sizeof(kdactl_kda_args));
  p.launcher = reinterpret_cast<Launcher>(PyLong_AsVoidPtr(args[3]));
  p.need = PyLong_AsUnsignedLongLong(args[4]);
  p.device = PyLong_AsLongLong(args[5]);
  p.seqlen = PyLong_AsLongLong(args[6]);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[7]); ++i)
    p.state_shape.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(args[7], i)));
  if (PyErr_Occurred() || !p.launcher) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "kdactl_host.remember: launcher is NULL");
    return nullptr;
  }
  size_t h = hash_of(p.meta, oh);
  if (find(h, p.meta, args[0])) Py_RETURN_TRUE;
  if (g_plans.size() >= kMaxPlans) forget_all();
  p.options = Py_NewRef(args[0]);
  p.launch = Py_NewRef(args[8]);
  g_plans.emplace(h, std::move(p));
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// The constants this module is built with that Python relies on, by their kdactl.kernel_abi names.
struct Constant {
  const char* name;
  long long value;
};
constexpr Constant kConstants[] = {
    {"ABI_VERSION", KDACTL_ABI_VERSION},
    {"ARGS_SIZE", static_cast<long long>(sizeof(kdactl_kda_args))},
    {"MAX_PLANS", static_cast<long long>(kMaxPlans)},
};

// Appends "; <what>" (the first without "; ") to `problems`.
void add_problem(std::string& problems, const std::string& what) {
  if (!problems.empty()) problems += "; ";
  problems += what;
}

std::string shown(PyObject* x) {
  PyObject* r = PyObject_Repr(x);
  std::string s = r && PyUnicode_Check(r) ? PyUnicode_AsUTF8(r) : "?";
  Py_XDECREF(r);
  PyErr_Clear();
  return s;
}

// check_abi(slots, constants): the call's fields in Python's order (kdactl.kernel_abi.CALL_FIELDS, a
// tuple of str) and Python's values of kConstants (a dict); ValueError naming every difference, else
// None and `configure` may run.
PyObject* check_abi(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "kdactl_host.check_abi(slots: tuple of str, constants: dict)");
    return nullptr;
  }
  g_abi_checked = false;
  std::string problems;
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < std::max<Py_ssize_t>(n, kCallSlots); ++i) {
    PyObject* theirs = i < n ? PyTuple_GET_ITEM(args[0], i) : nullptr;
    const char* name = theirs && PyUnicode_Check(theirs) ? PyUnicode_AsUTF8(theirs) : nullptr;
    PyErr_Clear();
    const char* ours = i < kCallSlots ? kSlotNames[i] : nullptr;
    if (ours && name && std::strcmp(ours, name) == 0) continue;
    add_problem(problems, "call field " + std::to_string(i) + " is " + (ours ? "'" + std::string(ours) + "'" : "missing") +
                              " in kdactl_host, " + (theirs ? shown(theirs) : "missing") + " in Python");
  }
  for (const Constant& c : kConstants) {
    PyObject* theirs = PyDict_GetItemString(args[1], c.name);  // borrowed
    long long value = theirs && PyLong_Check(theirs) ? PyLong_AsLongLong(theirs) : 0;
    PyErr_Clear();
    if (theirs && PyLong_Check(theirs) && value == c.value) continue;
    add_problem(problems, std::string(c.name) + " is " + std::to_string(c.value) + " in kdactl_host, " +
                              (theirs ? shown(theirs) : "missing") + " in Python");
  }
  if (PyDict_Size(args[1]) != static_cast<Py_ssize_t>(sizeof(kConstants) / sizeof(kConstants[0])))
    add_problem(problems, "Python gives " + std::to_string(PyDict_Size(args[1])) + " constants, kdactl_host knows " +
                              std::to_string(sizeof(kConstants) / sizeof(kConstants[0])));
  if (!problems.empty()) {
    PyErr_SetString(PyExc_ValueError, ("kdactl_host does not match kdactl.kernel_abi: " + problems).c_str());
    return nullptr;
  }
  g_abi_checked = true;
  Py_RETURN_NONE;
}

// configure(stream_of, current_device, capture_id_address), once check_abi has passed
PyObject* configure(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!g_abi_checked) {
    PyErr_SetString(PyExc_RuntimeError, "kdactl_host.configure: check_abi has not passed (kdactl.jit.host loads it)");
    return nullptr;
  }
  if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "kdactl_host.configure(stream_of, current_device, capture_id_address)");
    return nullptr;
  }
  forget_all();
  Py_XSETREF(g_stream_of, Py_NewRef(args[0]));
  Py_XSETREF(g_current_device, Py_NewRef(args[1]));
  g_capture_id = reinterpret_cast<CaptureId>(PyLong_AsVoidPtr(args[2]));
  if (PyErr_Occurred()) return nullptr;
  Py_RETURN_NONE;
}

PyObject* forget(PyObject*, PyObject*) {
  forget_all();
  Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(g_plans.size()); }

PyMethodDef methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL, "run a planned call"},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(remember)), METH_FASTCALL, "keep a plan"},
    {"check_abi", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(check_abi)), METH_FASTCALL,
     "check Python's tensor slots and constants against this module's"},
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure)), METH_FASTCALL,
     "set the device, stream and capture accessors (forgets every plan)"},
    {"forget_all", forget, METH_NOARGS, "forget every plan"},
    {"size", size, METH_NOARGS, "plans kept"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "kdactl_host", "kdactl's planned eager prefill path", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_kdactl_host(void) { return PyModule_Create(&module); }
