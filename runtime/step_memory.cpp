#include "step_memory.h"

#include "run_stats.h"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace lazy_mlir {

namespace {

// Below this, glibc serves a buffer from its bins without touching new pages.
constexpr size_t kMinBytes = 64 * 1024;
// A cached block no request took over this many group calls is freed: a
// step runs a few groups, each asking again for the sizes it freed.
constexpr uint64_t kMaxIdleCalls = 16;

thread_local bool tl_in_group = false;

class StepMemory final : public c10::Allocator {
 public:
  explicit StepMemory(c10::Allocator* base) : base_(base), base_raw_delete_(base->raw_deleter()) {}

  c10::DataPtr allocate(size_t n) override {
    if (!tl_in_group || n < kMinBytes || !on_.load(std::memory_order_relaxed)) return base_->allocate(n);
    std::lock_guard<std::mutex> lock(mutex_);
    void* data = takeCached(n);
    if (data != nullptr) {
      RunStats::get().step_memory_hits.fetch_add(1);
    } else {
      evictFor(n);
      c10::DataPtr fresh = base_->allocate(n);
      data = fresh.get();
      blocks_.emplace(data, Block{std::move(fresh), n, lru_.end(), 0});
      RunStats::get().step_memory_misses.fetch_add(1);
    }
    live_ += n;
    peak_ = std::max(peak_, live_);
    step_peak_ = std::max(step_peak_, live_);
    return {data, data, &StepMemory::free, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate/raw_deallocate (ideep's) work with both kinds of buffer.
  c10::DeleterFnPtr raw_deleter() const override { return &StepMemory::free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void free(void* data);

  // fork() copies the mutex as it is: a thread inside the cache while
  // another forks (a DataLoader's workers) would leave it locked in the child.
  void lockForFork() { mutex_.lock(); }
  void unlockAfterFork() { mutex_.unlock(); }

  void callStarted() { calls_.fetch_add(1, std::memory_order_relaxed); }

  // Frees the blocks that stayed cached through kMaxIdleCalls group calls:
  // sizes no group asks for any more (another batch shape, a first step's).
  void callEnded() {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t now = calls_.load(std::memory_order_relaxed);
    while (!lru_.empty() && blocks_.at(lru_.front()).freed_at + kMaxIdleCalls < now) evictOldest();
  }

  void setOn(bool on) {
    on_.store(on);
    if (!on) release();
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (void* data : lru_) blocks_.erase(data);  // the wrapped allocator's DataPtr frees it
    lru_.clear();
    free_.clear();
    cached_ = 0;
    peak_ = live_;
  }

  // The step that ends: its peak above what was live when it began (blocks
  // that outlive a step are state: the parameters a first step's graph
  // made, before donation writes them in place).
  void stepEnded() {
    std::lock_guard<std::mutex> lock(mutex_);
    last_step_peak_ = step_peak_ - std::min(step_peak_, step_start_live_);
    step_start_live_ = step_peak_ = live_;
  }

  std::map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {{"cached_bytes", static_cast<int64_t>(cached_)},
            {"live_bytes", static_cast<int64_t>(live_)},
            {"peak_bytes", static_cast<int64_t>(peak_)},
            {"last_step_peak_bytes", static_cast<int64_t>(last_step_peak_)},
            {"group_calls", static_cast<int64_t>(calls_.load())}};
  }

 private:
  struct Block {
    c10::DataPtr base;                // the wrapped allocator's buffer
    size_t size;
    std::list<void*>::iterator lru;   // in lru_ while cached, else lru_.end()
    uint64_t freed_at;                // calls_ when it was cached
  };

  void* takeCached(size_t n) {
    auto it = free_.find(n);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* data = it->second.back();  // the most recently freed: its pages are the warmest
    it->second.pop_back();
    Block& block = blocks_.at(data);
    lru_.erase(block.lru);
    block.lru = lru_.end();
    cached_ -= n;
    return data;
  }

  // Frees the least recently freed blocks until `n` more bytes keep the
  // held total under twice the peak. Not under the peak itself: a step
  // allocates an output (a new parameter) while last step's of that size is
  // still live, so it needs one block more than it freed; held to the
  // peak, each such miss evicts a block the step needs later, which misses
  // in turn, every step. With the slack the peak rises to take the overlap
  // in and the steps after hit every time.
  void evictFor(size_t n) {
    while (cached_ > 0 && live_ + cached_ + n > 2 * peak_) evictOldest();
  }

  void evictOldest() {
    void* data = lru_.front();
    lru_.pop_front();
    auto it = blocks_.find(data);
    std::vector<void*>& same = free_[it->second.size];
    same.erase(std::find(same.begin(), same.end(), data));
    cached_ -= it->second.size;
    blocks_.erase(it);
    RunStats::get().step_memory_evicted.fetch_add(1);
  }

  void giveBack(void* data) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = blocks_.find(data);
    if (it == blocks_.end()) {  // a raw_allocate'd buffer of the wrapped allocator
      lock.unlock();
      base_raw_delete_(data);
      return;
    }
    Block& block = it->second;
    live_ -= block.size;
    if (!on_.load(std::memory_order_relaxed)) {
      blocks_.erase(it);
      return;
    }
    block.lru = lru_.insert(lru_.end(), data);
    block.freed_at = calls_.load(std::memory_order_relaxed);
    free_[block.size].push_back(data);
    cached_ += block.size;
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_raw_delete_;
  std::atomic<bool> on_{true};
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;  // live and cached
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::list<void*> lru_;  // cached blocks, least recently freed first
  size_t cached_ = 0, live_ = 0, peak_ = 0;
  size_t step_start_live_ = 0, step_peak_ = 0, last_step_peak_ = 0;  // stepEnded()'s
  std::atomic<uint64_t> calls_{0};  // group calls begun (outermost scopes): no lock on the way in
};

// Never destroyed: tensors may be freed during interpreter shutdown.
std::atomic<StepMemory*> g_step_memory{nullptr};
std::once_flag g_install;

void StepMemory::free(void* data) { g_step_memory.load(std::memory_order_relaxed)->giveBack(data); }

}  // namespace

StepMemoryScope::StepMemoryScope() : outer_(!tl_in_group) {
  if (!outer_) return;
  tl_in_group = true;
  if (StepMemory* memory = g_step_memory.load()) memory->callStarted();
}

StepMemoryScope::~StepMemoryScope() {
  if (!outer_) return;
  tl_in_group = false;
  if (StepMemory* memory = g_step_memory.load()) memory->callEnded();
}

void setStepMemory(bool on) {
  if (!on && g_step_memory.load() == nullptr) return;
  std::call_once(g_install, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    TORCH_CHECK(base->raw_deleter() != nullptr, "lazy_mlir: the CPU allocator has no raw deleter");
    auto* memory = new StepMemory(base);
    g_step_memory.store(memory);
    pthread_atfork([] { g_step_memory.load()->lockForFork(); }, [] { g_step_memory.load()->unlockAfterFork(); },
                   [] { g_step_memory.load()->unlockAfterFork(); });
    c10::SetCPUAllocator(memory, /*priority=*/1);
  });
  g_step_memory.load()->setOn(on);
}

void releaseStepMemory() {
  if (StepMemory* memory = g_step_memory.load()) memory->release();
}

void stepMemoryStepEnded() {
  if (StepMemory* memory = g_step_memory.load()) memory->stepEnded();
}

std::map<std::string, int64_t> stepMemoryStats() {
  StepMemory* memory = g_step_memory.load();
  if (memory != nullptr) return memory->stats();
  return {{"cached_bytes", 0}, {"live_bytes", 0}, {"peak_bytes", 0}, {"last_step_peak_bytes", 0}, {"group_calls", 0}};
}

namespace {

// StepMemoryScope as a Python context manager (tests; a group's call opens
// its own in C++).
struct PythonScope {
  std::unique_ptr<StepMemoryScope> scope;
};

}  // namespace

void bindStepMemory(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<PythonScope>(m, "StepMemoryScope")
      .def(py::init<>())
      .def("__enter__", [](PythonScope& s) { s.scope = std::make_unique<StepMemoryScope>(); })
      .def("__exit__", [](PythonScope& s, const py::args&) { s.scope.reset(); });
  m.def("set_step_memory", &setStepMemory,
        "Keeps the large CPU buffers compiled groups allocate for the next step (runtime/step_memory.h).");
  m.def("release_step_memory", &releaseStepMemory, "Frees the buffers the step memory keeps.");
  m.def("step_memory_stats", &stepMemoryStats);
}

}  // namespace lazy_mlir
