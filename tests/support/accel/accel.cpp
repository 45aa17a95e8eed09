// A CPU-backed accelerator for PyTorch's PrivateUse1 dispatch key.
//
// Purpose: give the unmodified autograd Engine of the installed torch a
// device type with deviceCount() > 0, so that Engine::start_device_threads
// starts one worker thread per device index ("pt_autograd_<i>") and the
// Engine schedules backward nodes exactly as it would for CUDA devices:
// per-device ready queues, stream bookkeeping in InputBuffer, reentrant
// backward on device threads.  Memory is plain host memory, so every
// computation can run as the CPU kernel of the same op.
//
// A second device type, VE (``ve:<i>``), gets the same kernels and memory
// but is not an accelerator for the Engine (no streams, no events): it shows
// that the Engine runs index i of every device type on the same worker.
//
// Pieces:
//   * device and stream state (thread local, like CUDA's current device and
//     current stream), several stream ids per device;
//   * a DeviceGuardImpl whose event hooks (record/block/...) do nothing but
//     count and, while recording is on, log each call;
//   * a host allocator whose DataPtrs carry the accelerator device;
//   * factory, view, copy, resize and set_ kernels, and a boxed fallback that
//     runs every other op by viewing accelerator tensors as CPU tensors over
//     the same memory;
//   * a RecordFunction observer that logs, per OS thread, each
//     "autograd::engine::evaluate_function" scope the Engine opens, with the
//     node's name, sequence number, graph task id and nesting depth.
//
// The Python side (tests/support/pt_oracle.py) renames the backend to
// "accel" and reads the log back.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kAccel = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceType kTwin = c10::DeviceType::VE;
constexpr int kMaxDevices = 16;

constexpr int slot_of(c10::DeviceType t) { return t == kAccel ? 0 : 1; }
bool ours(c10::DeviceType t) { return t == kAccel || t == kTwin; }
c10::DispatchKey backend_key(c10::DeviceType t) {
  return t == kAccel ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::VE;
}
// Stream ids: 0 is each device's default stream, 1..kPoolStreams come from
// the "global pool" (round robin), ids from kFirstNewStream on are handed out
// by getNewStream.
constexpr c10::StreamId kPoolStreams = 4;
constexpr c10::StreamId kFirstNewStream = 100;

// ---------------------------------------------------------------------------
// Device count and thread-local device/stream state
// ---------------------------------------------------------------------------

c10::DeviceIndex device_total() {
  static const c10::DeviceIndex n = [] {
    int v = 2;
    if (const char* s = std::getenv("AUTOGRAD_RUN_ACCEL_DEVICES")) {
      v = std::atoi(s);
    }
    if (v < 1) v = 1;
    if (v > kMaxDevices) v = kMaxDevices;
    return static_cast<c10::DeviceIndex>(v);
  }();
  return n;
}

// Per device type: the current device, and per device the current stream.
thread_local std::array<c10::DeviceIndex, 2> tls_current{};
thread_local std::array<std::array<c10::StreamId, kMaxDevices>, 2> tls_streams{};  // all 0

c10::DeviceIndex& current(c10::DeviceType t) { return tls_current[slot_of(t)]; }

std::array<std::atomic<int64_t>, kMaxDevices> pool_cursor{};
std::atomic<c10::StreamId> next_new_stream{kFirstNewStream};
std::array<std::array<std::atomic<int64_t>, kMaxDevices>, 2> alloc_count{};

c10::DeviceIndex checked_index(c10::DeviceType t, c10::DeviceIndex i) {
  if (i < 0) return current(t);
  TORCH_CHECK(i < device_total(), t, ": device index ", static_cast<int>(i),
              " out of range (", static_cast<int>(device_total()), " devices)");
  return i;
}

// ---------------------------------------------------------------------------
// The log
// ---------------------------------------------------------------------------

struct LogEntry {
  uint64_t order;   // global position
  int64_t tid;      // OS thread id
  std::string kind; // node, end, record, block, record_stream, sync_stream, sync_event
  std::string name; // node name (node/end)
  uint64_t seq;     // node sequence nr (node)
  int64_t a, b, c, d;
};

std::atomic<bool> recording{false};
std::mutex log_mutex;
std::vector<LogEntry> log_entries;
uint64_t log_counter = 0;
std::map<int64_t, std::string> thread_names;  // tid -> name when first logged

struct Counters {
  std::atomic<int64_t> record{0}, block{0}, query{0}, destroy{0},
      sync_event{0}, sync_stream{0}, record_stream{0}, events_created{0};
};
Counters counters;

int64_t os_tid() {
  static thread_local int64_t t = static_cast<int64_t>(syscall(SYS_gettid));
  return t;
}

void log_entry(const char* kind, std::string name, uint64_t seq, int64_t a,
               int64_t b, int64_t c, int64_t d) {
  if (!recording.load(std::memory_order_acquire)) return;
  const int64_t tid = os_tid();
  std::lock_guard<std::mutex> g(log_mutex);
  if (thread_names.find(tid) == thread_names.end()) {
    char buf[32] = {0};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    thread_names[tid] = buf;
  }
  log_entries.push_back(
      LogEntry{log_counter++, tid, kind, std::move(name), seq, a, b, c, d});
}

// ---------------------------------------------------------------------------
// Events: the handle the Engine stores in c10::Event is a pointer to one of
// these.  Nothing is asynchronous here, so an event is only an identity.
// ---------------------------------------------------------------------------

struct AccelEvent {
  int64_t id;
  int64_t version = 0;
  c10::DeviceIndex device = -1;
  c10::StreamId stream = 0;
};
std::atomic<int64_t> next_event_id{1};

// ---------------------------------------------------------------------------
// DeviceGuardImpl
// ---------------------------------------------------------------------------

template <c10::DeviceType T>
struct HostGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return T; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == T, T, " guard got device ", d);
    const c10::Device old(T, current(T));
    current(T) = checked_index(T, d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(T, current(T)); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == T, T, " guard got device ", d);
    current(T) = checked_index(T, d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_total()) current(T) = d.index();
  }

  static c10::Stream make_stream(c10::DeviceIndex i, c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(T, i), id);
  }
  static c10::StreamId& current_stream(c10::DeviceIndex i) { return tls_streams[slot_of(T)][i]; }
  c10::Stream getStream(c10::Device d) const override {
    const auto i = checked_index(T, d.index());
    return make_stream(i, current_stream(i));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return make_stream(checked_index(T, d.index()), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high*/) const override {
    const auto i = checked_index(T, d.index());
    const auto k = pool_cursor[i].fetch_add(1);
    return make_stream(i, 1 + (k % kPoolStreams));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return make_stream(checked_index(T, d.index()), next_new_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto i = checked_index(T, s.device_index());
    const c10::Stream old = make_stream(i, current_stream(i));
    current_stream(i) = s.id();
    return old;
  }

  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "accel: event recorded on a stream of another device");
    auto* ev = static_cast<AccelEvent*>(*event);
    if (ev == nullptr) {
      ev = new AccelEvent{next_event_id.fetch_add(1)};
      *event = ev;
      counters.events_created++;
    }
    ev->version++;
    ev->device = stream.device_index();
    ev->stream = stream.id();
    counters.record++;
    log_entry("record", "", 0, stream.device_index(), stream.id(), ev->id, ev->version);
  }
  void block(void* event, const c10::Stream& stream) const override {
    auto* ev = static_cast<AccelEvent*>(event);
    if (ev == nullptr) return;  // never recorded: nothing to wait for
    counters.block++;
    log_entry("block", "", 0, stream.device_index(), stream.id(), ev->id, ev->version);
  }
  bool queryEvent(void* /*event*/) const override {
    counters.query++;
    return true;  // work is done synchronously
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*i*/) const noexcept override {
    if (event != nullptr) {
      counters.destroy++;
      delete static_cast<AccelEvent*>(event);
    }
  }
  void synchronizeEvent(void* event) const override {
    counters.sync_event++;
    auto* ev = static_cast<AccelEvent*>(event);
    log_entry("sync_event", "", 0, ev ? ev->device : -1, ev ? ev->stream : -1,
              ev ? ev->id : -1, ev ? ev->version : 0);
  }
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0.0; }

  c10::DeviceIndex deviceCount() const noexcept override { return device_total(); }

  bool queryStream(const c10::Stream& /*s*/) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override {
    counters.sync_stream++;
    log_entry("sync_stream", "", 0, s.device_index(), s.id(), -1, 0);
  }
  void synchronizeDevice(const c10::DeviceIndex /*i*/) const override {}

  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& s) const override {
    counters.record_stream++;
    log_entry("record_stream", "", 0, s.device_index(), s.id(), -1, data.device().index());
  }
};

const c10::impl::DeviceGuardImplRegistrar accel_guard(kAccel, new HostGuardImpl<kAccel>());
const c10::impl::DeviceGuardImplRegistrar twin_guard(kTwin, new HostGuardImpl<kTwin>());

// ---------------------------------------------------------------------------
// Host allocator
// ---------------------------------------------------------------------------

void host_free(void* p) { std::free(p); }

template <c10::DeviceType T>
struct HostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const auto i = current(T);
    void* p = nullptr;
    if (n > 0) {
      const size_t aligned = (n + 63) / 64 * 64;
      p = std::aligned_alloc(64, aligned);
      TORCH_CHECK(p != nullptr, "accel: out of host memory (", n, " bytes)");
    }
    alloc_count[slot_of(T)][i]++;
    return c10::DataPtr(p, p, &host_free, c10::Device(T, i));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
};

HostAllocator<kAccel> accel_allocator;
HostAllocator<kTwin> twin_allocator;
const bool allocators_registered = [] {
  c10::SetAllocator(kAccel, &accel_allocator);
  c10::SetAllocator(kTwin, &twin_allocator);
  return true;
}();

c10::Allocator* allocator_for(c10::DeviceType t) {
  return t == kAccel ? static_cast<c10::Allocator*>(&accel_allocator) : &twin_allocator;
}

c10::DataPtr allocate_on(c10::Device d, size_t n) {
  c10::DeviceGuard g(d);
  return allocator_for(d.type())->allocate(n);
}

// ---------------------------------------------------------------------------
// Hooks (the Engine asks them whether a device has a context when it stashes
// the caller's current streams)
// ---------------------------------------------------------------------------

struct AccelHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex i) const override {
    return i >= 0 && i < device_total();
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return device_total(); }
  void setCurrentDevice(c10::DeviceIndex i) const override {
    current(kAccel) = checked_index(kAccel, i);
  }
  c10::DeviceIndex getCurrentDevice() const override { return current(kAccel); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex i) const override {
    const auto old = current(kAccel);
    current(kAccel) = checked_index(kAccel, i);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex i) const override {
    return exchangeDevice(i);
  }
  // The accelerator has no RNG of its own: kernels run on CPU and use the
  // CPU generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kAccel, current(kAccel)); }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {
    auto* s = storage.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), "accel: storage is not resizable");
    c10::DataPtr fresh = allocate_on(storage.device(), n);
    const size_t keep = std::min(n, s->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), s->data_ptr().get(), keep);
    s->set_data_ptr_noswap(std::move(fresh));
    s->set_nbytes(n);
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new AccelHooks());
  return true;
}();

// ---------------------------------------------------------------------------
// Tensor helpers
// ---------------------------------------------------------------------------

bool on_ours(const at::Tensor& t) { return t.defined() && ours(t.device().type()); }

// A tensor of `keys` over `storage` with the given geometry.
at::Tensor tensor_over(c10::Storage storage, c10::DispatchKeySet keys,
                       caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                       c10::IntArrayRef strides, int64_t offset, bool conj,
                       bool neg) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, dtype);
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(sizes, strides, offset);
  impl->_set_conj(conj);
  impl->_set_neg(neg);
  return t;
}

void check_fits(const at::Tensor& self, c10::IntArrayRef size,
                c10::IntArrayRef stride, int64_t offset) {
  TORCH_CHECK(size.size() == stride.size(), "accel: ", size.size(),
              " sizes but ", stride.size(), " strides");
  TORCH_CHECK(offset >= 0, "accel: negative storage offset");
  const size_t need = at::detail::computeStorageNbytes(size, stride, self.itemsize(),
                                                       static_cast<size_t>(offset));
  TORCH_CHECK(need <= self.storage().nbytes(), "accel: view of ", need,
              " bytes is out of bounds for a storage of ", self.storage().nbytes());
}

// A view of `self` (same storage, same keys) with new geometry.
at::Tensor alias_of(const at::Tensor& self, c10::IntArrayRef size,
                    c10::IntArrayRef stride, int64_t offset) {
  check_fits(self, size, stride, offset);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(self.storage()), self.key_set(), self.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return t;
}

void drop_storage_ref(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// Per-call bookkeeping for running an op as its CPU kernel.  Every
// accelerator storage met gets one CPU storage over the same bytes (so two
// arguments that alias keep aliasing); afterwards results are mapped back.
struct CpuView {
  struct Pair {
    c10::Storage accel;
    c10::Storage cpu;
    void* data;
    size_t nbytes;
  };
  std::vector<Pair> storages;
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;  // (accel, its CPU view)
  std::vector<c10::TensorImpl*> untouched;                  // CPU tensors passed in

  c10::Storage cpu_storage_for(const c10::Storage& s) {
    for (auto& p : storages) {
      if (p.accel.unsafeGetStorageImpl() == s.unsafeGetStorageImpl()) return p.cpu;
    }
    void* data = const_cast<void*>(s.data_ptr().get());
    c10::DataPtr dp(data, new c10::Storage(s), &drop_storage_ref, c10::Device(c10::kCPU));
    c10::Storage cpu(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), s.nbytes(), std::move(dp),
        c10::GetCPUAllocator(), s.resizable()));
    storages.push_back(Pair{s, cpu, data, s.nbytes()});
    return cpu;
  }

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!on_ours(t)) {
      if (t.defined()) untouched.push_back(t.unsafeGetTensorImpl());
      return t;
    }
    for (auto& p : tensors) {
      if (p.first.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return p.second;
    }
    TORCH_CHECK(t.has_storage(), "accel: tensors without storage are not supported");
    auto cpu = tensor_over(cpu_storage_for(t.storage()), c10::DispatchKeySet(c10::DispatchKey::CPU),
                           t.dtype(), t.sizes(), t.strides(), t.storage_offset(),
                           t.is_conj(), t.is_neg());
    tensors.emplace_back(t, cpu);
    return cpu;
  }

  // A CPU kernel may have reallocated a CPU view's storage (resizing an out=
  // argument): move the new bytes under the accelerator storage.
  void write_back_storages() {
    for (auto& p : storages) {
      auto* cs = p.cpu.unsafeGetStorageImpl();
      if (cs->data_ptr().get() == p.data && cs->nbytes() == p.nbytes) continue;
      auto* as = p.accel.unsafeGetStorageImpl();
      c10::DataPtr moved = cs->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
      moved.unsafe_set_device(as->data_ptr().device());
      as->set_data_ptr_noswap(std::move(moved));
      as->set_nbytes(cs->nbytes());
      cs->set_nbytes(0);
    }
  }

  // Copy a written CPU view's geometry back to its accelerator tensor.
  void write_back_geometry(const at::Tensor& cpu) {
    for (auto& p : tensors) {
      if (p.second.unsafeGetTensorImpl() != cpu.unsafeGetTensorImpl()) continue;
      auto* impl = p.first.unsafeGetTensorImpl();
      if (p.first.sizes() != cpu.sizes() || p.first.strides() != cpu.strides() ||
          p.first.storage_offset() != cpu.storage_offset()) {
        impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
      }
    }
  }

  const c10::Storage* accel_storage_of(const c10::StorageImpl* cpu) const {
    for (auto& p : storages) {
      if (p.cpu.unsafeGetStorageImpl() == cpu) return &p.accel;
    }
    return nullptr;
  }

  // Map one CPU result back: an argument's CPU view becomes that argument, a
  // view of an argument becomes a view of the accelerator storage, a fresh
  // CPU tensor is adopted by the accelerator (its bytes relabelled, or copied
  // when its storage is shared with something else).
  at::Tensor from_cpu(const at::Tensor& r, c10::Device dev, int refs_here) {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    for (auto& p : tensors) {
      if (p.second.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return p.first;
    }
    for (auto* u : untouched) {
      if (u == r.unsafeGetTensorImpl()) return r;
    }
    c10::Storage st;
    if (const auto* a = accel_storage_of(r.storage().unsafeGetStorageImpl())) {
      st = *a;
    } else if (r.storage().use_count() <= refs_here) {
      st = r.storage();
      auto* si = st.unsafeGetStorageImpl();
      si->mutable_data_ptr().unsafe_set_device(dev);
      si->set_allocator(allocator_for(dev.type()));
    } else {
      const size_t n = r.storage().nbytes();
      c10::DataPtr dp = allocate_on(dev, n);
      if (n > 0) std::memcpy(dp.get(), r.storage().data_ptr().get(), n);
      st = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), n, std::move(dp), allocator_for(dev.type()), true));
    }
    return tensor_over(st, c10::DispatchKeySet(backend_key(dev.type())), r.dtype(),
                       r.sizes(), r.strides(), r.storage_offset(), r.is_conj(), r.is_neg());
  }
};

// The device every accelerator argument of one op is on (ops other than
// copies must not mix devices, as with CUDA).
struct DeviceVote {
  std::optional<c10::Device> dev;
  const char* op;
  void see(c10::Device d) {
    if (!dev) {
      dev = d;
    } else {
      TORCH_CHECK(*dev == d, "Expected all tensors to be on the same device, but found at least "
                  "two devices, ", *dev, " and ", d, " (in ", op, ")");
    }
  }
};

// ---------------------------------------------------------------------------
// Explicit kernels
// ---------------------------------------------------------------------------

template <c10::DeviceType T>
c10::Device target_device(std::optional<c10::Device> d) {
  if (!d || d->index() < 0) return c10::Device(T, current(T));
  TORCH_CHECK(d->type() == T, T, " kernel asked for device ", *d);
  return c10::Device(T, checked_index(T, d->index()));
}

void check_layout(std::optional<c10::Layout> layout) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "accel: only strided tensors");
}

template <c10::DeviceType T>
at::Tensor accel_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                       std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                       std::optional<bool> /*pin*/, std::optional<c10::MemoryFormat> mf) {
  check_layout(layout);
  c10::DeviceGuard g(target_device<T>(device));
  return at::detail::empty_generic(size, allocator_for(T), c10::DispatchKeySet(backend_key(T)),
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), mf);
}

template <c10::DeviceType T>
at::Tensor accel_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> /*pin*/) {
  check_layout(layout);
  c10::DeviceGuard g(target_device<T>(device));
  return at::detail::empty_strided_generic(size, stride, allocator_for(T),
                                           c10::DispatchKeySet(backend_key(T)),
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()));
}

at::Tensor accel_as_strided(const at::Tensor& self, c10::IntArrayRef size,
                            c10::IntArrayRef stride, std::optional<int64_t> offset) {
  return alias_of(self, size, stride, offset.value_or(self.storage_offset()));
}

at::Tensor accel_view(const at::Tensor& self, c10::IntArrayRef size) {
  const at::DimVector shape = at::infer_size_dv(size, self.numel());
  auto stride = at::detail::computeStride(self.sizes(), self.strides(), shape);
  TORCH_CHECK(stride.has_value(), "view size is not compatible with input tensor's size and "
              "stride (at least one dimension spans across two contiguous subspaces). "
              "Use .reshape(...) instead.");
  return alias_of(self, shape, *stride, self.storage_offset());
}

at::Tensor accel_reshape_alias(const at::Tensor& self, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  return alias_of(self, size, stride, self.storage_offset());
}

// copy_ between any two of {CPU, accel:i}: host memory on both sides, so it
// is the CPU copy over CPU views.
at::Tensor& accel_copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  CpuView v;
  at::Tensor dst = v.to_cpu(self);
  at::Tensor from = v.to_cpu(src);
  {
    at::AutoDispatchBelowADInplaceOrView below;
    dst.copy_(from);
  }
  return self;
}

at::Tensor accel_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  accel_copy_(d, self, non_blocking);
  return dst;
}

at::Tensor accel_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  at::Tensor d = dst;
  accel_copy_(d, self, false);
  return dst;
}

const at::Tensor& accel_resize_(const at::Tensor& self, c10::IntArrayRef size,
                                std::optional<c10::MemoryFormat> mf) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (mf && *mf != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(*mf);
  if (self.numel() == 0) return self;
  const size_t need = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.itemsize(), static_cast<size_t>(self.storage_offset()));
  const c10::Storage& st = self.storage();
  if (need > st.nbytes()) {
    auto* s = st.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = allocate_on(self.device(), need);
    if (s->nbytes() > 0 && s->data_ptr().get() != nullptr) {
      std::memcpy(fresh.get(), s->data_ptr().get(), s->nbytes());
    }
    s->set_data_ptr_noswap(std::move(fresh));
    s->set_nbytes(need);
  }
  return self;
}

at::Tensor& accel_set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                              c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == self.device().type(), "set_ of a tensor on ", self.device(),
              " from a storage on ", source.device());
  at::DimVector st;
  if (stride.empty()) {
    st = c10::contiguous_strides(size);
  } else {
    st = at::DimVector(stride.begin(), stride.end());
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, st, offset);
  return self;
}

at::Tensor& accel_set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return accel_set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& accel_set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return self;
  return accel_set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& accel_set_empty(at::Tensor& self) {
  c10::Storage s(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, allocate_on(self.device(), 0),
      allocator_for(self.device().type()), true));
  return accel_set_storage(self, std::move(s), 0, {0}, {});
}

// Convolutions: for a backend other than CPU/CUDA/... ATen's composite
// convolution calls the "overrideable" ops, whose default kernel raises.
// Run the CPU convolution instead.
c10::Device conv_device(const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(on_ours(input) && on_ours(weight) && input.device() == weight.device(),
              "convolution: input on ", input.device(), ", weight on ", weight.device());
  return input.device();
}

at::Tensor accel_convolution(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                             c10::IntArrayRef output_padding, int64_t groups) {
  const auto dev = conv_device(input, weight);
  CpuView v;
  std::optional<at::Tensor> b;
  if (bias && bias->defined()) b = v.to_cpu(*bias);
  at::Tensor out = at::convolution(v.to_cpu(input), v.to_cpu(weight), b, stride, padding,
                                   dilation, transposed, output_padding, groups);
  return v.from_cpu(out, dev, 1);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> accel_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  const auto dev = conv_device(input, weight);
  CpuView v;
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto [gi, gw, gb] = at::convolution_backward(
      v.to_cpu(grad_output), v.to_cpu(input), v.to_cpu(weight), at::IntArrayRef{channels},
      stride, padding, dilation, transposed, output_padding, groups, output_mask);
  return {v.from_cpu(gi, dev, 1), v.from_cpu(gw, dev, 1), v.from_cpu(gb, dev, 1)};
}

// ---------------------------------------------------------------------------
// Boxed fallback: run the op's CPU kernel on CPU views of the arguments.
// ---------------------------------------------------------------------------

bool is_tensor_list_type(const c10::TypePtr& t) {
  if (t->kind() != c10::TypeKind::ListType) return false;
  auto elem = t->castRaw<c10::ListType>()->getElementType();
  if (elem->kind() == c10::TypeKind::OptionalType) {
    elem = elem->castRaw<c10::OptionalType>()->getElementType();
  }
  return elem->kind() == c10::TypeKind::TensorType;
}

c10::IValue list_to_cpu(const c10::IValue& v, CpuView& view, DeviceVote& vote) {
  if (v.isTensorList()) {
    const auto in = v.toTensorList();
    c10::List<at::Tensor> out;
    for (size_t i = 0; i < in.size(); ++i) {
      const at::Tensor t = in.get(i);
      if (on_ours(t)) vote.see(t.device());
      out.push_back(view.to_cpu(t));
    }
    return out;
  }
  const auto in = v.toList();
  c10::impl::GenericList out(in.elementType());
  for (size_t i = 0; i < in.size(); ++i) {
    const c10::IValue e = in.get(i);
    if (e.isTensor()) {
      const auto& t = e.toTensor();
      if (on_ours(t)) vote.see(t.device());
      out.push_back(view.to_cpu(t));
    } else {
      out.push_back(e);
    }
  }
  return out;
}

template <c10::DeviceType T>
void accel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  CpuView view;
  DeviceVote vote{std::nullopt, schema.name().c_str()};
  std::vector<size_t> written;  // stack positions of mutable tensor arguments

  for (size_t k = 0; k < nargs; ++k) {
    c10::IValue& v = (*stack)[first + k];
    const auto& arg = schema.arguments()[k];
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      if (on_ours(t)) vote.see(t.device());
      v = view.to_cpu(t);
      if (arg.alias_info() && arg.alias_info()->isWrite()) written.push_back(first + k);
    } else if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      if (ours(d.type())) {
        vote.see(c10::Device(d.type(), d.index() < 0 ? current(d.type()) : d.index()));
        v = c10::Device(c10::kCPU);
      }
    } else if (v.isList() && is_tensor_list_type(arg.type())) {
      v = list_to_cpu(v, view, vote);
    } else {
      TORCH_CHECK(!v.isStorage() || !ours(v.toStorage().device().type()),
                  "no CPU fallback for ", schema.name(), " with a storage argument on ", T);
    }
  }
  // Keep the CPU views of written arguments to copy their geometry back.
  std::vector<at::Tensor> written_cpu;
  for (size_t pos : written) written_cpu.push_back((*stack)[pos].toTensor());

  const c10::Device dev = vote.dev.value_or(c10::Device(T, current(T)));
  {
    c10::DeviceGuard g(dev);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  view.write_back_storages();
  for (const auto& t : written_cpu) view.write_back_geometry(t);

  const size_t nret = schema.returns().size();
  const size_t rfirst = stack->size() - nret;
  // How many returned tensors hold each CPU storage (to know whether a fresh
  // storage is referenced only by this op's results).
  std::unordered_map<const c10::StorageImpl*, int> refs;
  auto count = [&](const at::Tensor& t) {
    if (t.defined() && t.device().type() == c10::kCPU && t.has_storage()) {
      refs[t.storage().unsafeGetStorageImpl()]++;
    }
  };
  for (size_t k = rfirst; k < stack->size(); ++k) {
    const c10::IValue& r = (*stack)[k];
    if (r.isTensor()) {
      count(r.toTensor());
    } else if (r.isTensorList()) {
      const auto l = r.toTensorList();
      for (size_t i = 0; i < l.size(); ++i) count(l.get(i));
    }
  }
  auto back = [&](const at::Tensor& t) {
    const int n = (t.defined() && t.has_storage() && t.device().type() == c10::kCPU)
        ? refs[t.storage().unsafeGetStorageImpl()] : 0;
    return view.from_cpu(t, dev, n);
  };
  for (size_t k = rfirst; k < stack->size(); ++k) {
    c10::IValue& r = (*stack)[k];
    if (r.isTensor()) {
      at::Tensor t = r.toTensor();
      r = c10::IValue();  // drop the stack's reference before adopting
      r = back(t);
    } else if (r.isTensorList()) {
      const auto l = r.toTensorList();
      c10::List<at::Tensor> out;
      for (size_t i = 0; i < l.size(); ++i) out.push_back(back(l.get(i)));
      r = out;
    }
  }
}

template <c10::DeviceType T>
void register_kernels(torch::Library& m) {
  m.impl("empty.memory_format", TORCH_FN(accel_empty<T>));
  m.impl("empty_strided", TORCH_FN(accel_empty_strided<T>));
  m.impl("as_strided", TORCH_FN(accel_as_strided));
  m.impl("view", TORCH_FN(accel_view));
  m.impl("_reshape_alias", TORCH_FN(accel_reshape_alias));
  m.impl("copy_", TORCH_FN(accel_copy_));
  m.impl("_copy_from", TORCH_FN(accel_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(accel_copy_from_and_resize));
  m.impl("resize_", TORCH_FN(accel_resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(accel_set_storage));
  m.impl("set_.source_Storage", TORCH_FN(accel_set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(accel_set_source_tensor));
  m.impl("set_", TORCH_FN(accel_set_empty));
  m.impl("convolution_overrideable", TORCH_FN(accel_convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(accel_convolution_backward));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { register_kernels<kAccel>(m); }
TORCH_LIBRARY_IMPL(aten, VE, m) { register_kernels<kTwin>(m); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&accel_fallback<kAccel>>());
}
TORCH_LIBRARY_IMPL(_, VE, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&accel_fallback<kTwin>>());
}

// ---------------------------------------------------------------------------
// Engine observer: the Engine opens a RecordFunction scope named
// "autograd::engine::evaluate_function: <node>" around each node it
// evaluates, after setting the thread's current node.
// ---------------------------------------------------------------------------

constexpr char kEvalPrefix[] = "autograd::engine::evaluate_function: ";
thread_local int eval_depth = 0;

struct NodeScope : public at::ObserverContext {
  std::string name;
};

std::unique_ptr<at::ObserverContext> on_scope_enter(const at::RecordFunction& fn) {
  if (!recording.load(std::memory_order_acquire)) return nullptr;
  const char* name = fn.name();
  if (name == nullptr || std::strncmp(name, kEvalPrefix, sizeof(kEvalPrefix) - 1) != 0) {
    return nullptr;
  }
  auto node = torch::autograd::get_current_node();
  auto ctx = std::make_unique<NodeScope>();
  ctx->name = node ? node->name() : std::string(name + sizeof(kEvalPrefix) - 1);
  int64_t leaf = 0;
  if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
    leaf = reinterpret_cast<int64_t>(acc->variable.unsafeGetTensorImpl());
  }
  ++eval_depth;
  log_entry("node", ctx->name, node ? node->sequence_nr() : 0,
            torch::autograd::get_current_graph_task_id(), eval_depth, leaf,
            static_cast<int64_t>(current(kAccel)));
  return ctx;
}

void on_scope_exit(const at::RecordFunction& /*fn*/, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  auto* scope = static_cast<NodeScope*>(ctx);
  log_entry("end", scope->name, 0, torch::autograd::get_current_graph_task_id(), eval_depth, 0, 0);
  --eval_depth;
}

const bool observer_added = [] {
  at::addGlobalCallback(at::RecordFunctionCallback(&on_scope_enter, &on_scope_exit)
                            .scopes({at::RecordScope::FUNCTION}));
  return true;
}();

// ---------------------------------------------------------------------------
// Python access
// ---------------------------------------------------------------------------

pybind11::list take_log() {
  std::vector<LogEntry> taken;
  {
    std::lock_guard<std::mutex> g(log_mutex);
    taken.swap(log_entries);
  }
  pybind11::list out;
  for (auto& e : taken) {
    out.append(pybind11::make_tuple(e.order, e.tid, e.kind, e.name, e.seq, e.a, e.b, e.c, e.d));
  }
  return out;
}

std::map<std::string, int64_t> counter_values() {
  return {{"record", counters.record.load()},
          {"block", counters.block.load()},
          {"query", counters.query.load()},
          {"destroy", counters.destroy.load()},
          {"sync_event", counters.sync_event.load()},
          {"sync_stream", counters.sync_stream.load()},
          {"record_stream", counters.record_stream.load()},
          {"events_created", counters.events_created.load()}};
}

std::map<std::string, std::vector<int64_t>> allocations() {
  std::map<std::string, std::vector<int64_t>> out;
  for (c10::DeviceType t : {kAccel, kTwin}) {
    auto& v = out[c10::DeviceTypeName(t, /*lower_case=*/true)];
    for (int i = 0; i < device_total(); ++i) v.push_back(alloc_count[slot_of(t)][i].load());
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CPU-backed accelerator on PrivateUse1 with an event/node log (autograd-run tests)";
  (void)hooks_registered;
  (void)allocators_registered;
  (void)observer_added;
  m.def("device_count", [] { return static_cast<int>(device_total()); });
  m.def("current_device", [] { return static_cast<int>(current(kAccel)); });
  m.def("set_device", [](int i) {
    current(kAccel) = checked_index(kAccel, static_cast<c10::DeviceIndex>(i));
  });
  m.def("current_stream", [](int i) {
    const auto d = checked_index(kAccel, static_cast<c10::DeviceIndex>(i));
    return static_cast<int64_t>(tls_streams[slot_of(kAccel)][d]);
  }, "id of the calling thread's current stream on accel:i");
  m.def("set_stream", [](int i, int64_t id) {
    const auto d = checked_index(kAccel, static_cast<c10::DeviceIndex>(i));
    auto& cur = tls_streams[slot_of(kAccel)][d];
    const auto old = cur;
    cur = id;
    return static_cast<int64_t>(old);
  }, "make stream `id` current on accel:i for the calling thread; returns the previous id");
  m.def("set_recording", [](bool on) { recording.store(on, std::memory_order_release); });
  m.def("is_recording", [] { return recording.load(); });
  m.def("take_log", &take_log,
        "log entries since the last call: (order, tid, kind, name, seq, a, b, c, d)");
  m.def("thread_names", [] {
    std::lock_guard<std::mutex> g(log_mutex);
    return thread_names;
  }, "OS thread name of each thread id when it first logged");
  m.def("counters", &counter_values, "calls of the event/stream hooks since load");
  m.def("allocations", &allocations, "allocations per device since load");
  m.def("os_tid", [] { return os_tid(); });
}
