#include "step_memory.h"

#include "run_stats.h"

#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>

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
// Offsets in a plan's arena keep c10's alignment.
constexpr size_t kAlign = 64;
// Steps in a row that did not follow the plan the step before made, before
// planning stops until new code (release()): sizes that never repeat.
constexpr int kMaxReplans = 3;
constexpr size_t kNotPlanned = static_cast<size_t>(-1);
// A step with more large allocations than this is not planned (the
// planner's time grows with their square).
constexpr size_t kMaxPlanned = 8192;

// One step's allocations in the order they came: their sizes and when each
// was allocated and freed, on one clock of both (kNotPlanned: not freed
// within the step, such as an output that outlives it).
struct TraceEntry {
  size_t size;
  size_t allocated, freed;
};

// Offsets in one arena for the buffers of a step whose allocations repeat
// (XLA's buffer assignment, on a recorded step): two buffers share bytes
// only if their lifetimes did not overlap. Greedy by size, largest first,
// each at the lowest offset clear of those placed that live at the same
// time: within a few percent of the bytes live at the step's peak.
struct Plan {
  std::vector<size_t> offsets;  // by allocation index; kNotPlanned for buffers that outlive the step
  std::vector<size_t> sizes;
  size_t bytes = 0;
  c10::DataPtr arena;              // allocated at the first buffer it serves
  std::map<size_t, size_t> live;   // offset -> end of the buffers handed out and not yet freed

  explicit Plan(const std::vector<TraceEntry>& trace) {
    offsets.assign(trace.size(), kNotPlanned);
    sizes.reserve(trace.size());
    std::vector<size_t> order;
    for (size_t i = 0; i < trace.size(); ++i) {
      sizes.push_back(trace[i].size);
      if (trace[i].freed != kNotPlanned) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return trace[a].size > trace[b].size; });
    std::vector<size_t> placed;
    std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of placed buffers alive at the same time
    for (size_t i : order) {
      const size_t need = (trace[i].size + kAlign - 1) / kAlign * kAlign;
      taken.clear();
      for (size_t j : placed) {
        if (trace[j].allocated < trace[i].freed && trace[i].allocated < trace[j].freed) {
          taken.emplace_back(offsets[j], offsets[j] + (trace[j].size + kAlign - 1) / kAlign * kAlign);
        }
      }
      std::sort(taken.begin(), taken.end());
      size_t at = 0;
      for (const auto& [begin, end] : taken) {
        if (begin >= at + need) break;
        at = std::max(at, end);
      }
      offsets[i] = at;
      bytes = std::max(bytes, at + need);
      placed.push_back(i);
    }
  }

  // Whether [offset, offset + n) is clear of the buffers handed out (a step
  // whose buffers live longer than the recorded one's gets no shared bytes).
  bool clear(size_t offset, size_t n) const {
    auto next = live.lower_bound(offset);
    if (next != live.end() && next->first < offset + n) return false;
    return next == live.begin() || std::prev(next)->second <= offset;
  }

  // Gives the whole pages of the arena's [begin, end) back to the system;
  // the arena keeps its addresses, and a page reads as zeros when next
  // touched. Pages shared with bytes outside the range stay.
  void dropPages(size_t begin, size_t end) const {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    if (!arena || end <= begin) return;
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena.get());
    const uintptr_t lo = (base + begin + page - 1) & ~(page - 1), hi = (base + end) & ~(page - 1);
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }

  // Every page no handed-out buffer is on.
  void dropUnused() const {
    size_t at = 0;
    for (const auto& [begin, end] : live) {
      dropPages(at, begin);
      at = std::max(at, end);
    }
    dropPages(at, bytes);
  }
};

thread_local bool tl_in_group = false;

class StepMemory final : public c10::Allocator {
 public:
  explicit StepMemory(c10::Allocator* base) : base_(base), base_raw_delete_(base->raw_deleter()) {}

  c10::DataPtr allocate(size_t n) override {
    if (!tl_in_group || n < kMinBytes || !on_.load(std::memory_order_relaxed)) return base_->allocate(n);
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t index = trace_.size();
    if (index < kMaxPlanned) trace_.push_back({n, clock_++, kNotPlanned});
    void* data = index < kMaxPlanned ? fromPlan(index, n) : nullptr;
    if (data != nullptr) {
      RunStats::get().step_memory_planned.fetch_add(1);
    } else if (planning_ && !followed_) {
      // a run's first steps, planned from: their own pages, given back as
      // they are freed, so that the buffers they hold never exceed those live
      data = mapFresh(n);
      RunStats::get().step_memory_misses.fetch_add(1);
    } else if ((data = takeCached(n)) != nullptr) {
      RunStats::get().step_memory_hits.fetch_add(1);
    } else {
      evictFor(n);
      c10::DataPtr fresh = base_->allocate(n);
      data = fresh.get();
      blocks_.emplace(data, Block{std::move(fresh), n, lru_.end(), 0});
      RunStats::get().step_memory_misses.fetch_add(1);
    }
    Block& block = blocks_.at(data);
    block.step = step_;
    block.index = index;
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

  // New code: new sizes are likely. The plan goes too (its arena once no
  // buffer of it is live) and the next steps are planned afresh.
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    dropCache();
    peak_ = live_;
    plan_.reset();
    followed_ = false;
    planning_ = true;
    replans_ = strays_ = 0;
    last_stray_.clear();
  }

  // The step that ends: its peak above what was live when it began (blocks
  // that outlive a step are state: the parameters a first step's graph
  // made, before donation writes them in place).
  //
  // The step's allocations become the next step's plan unless they
  // followed the current one (one step that strays keeps a plan that
  // served: an evaluation between training steps).
  void stepEnded() {
    std::lock_guard<std::mutex> lock(mutex_);
    last_step_peak_ = step_peak_ - std::min(step_peak_, step_start_live_);
    step_start_live_ = step_peak_ = live_;
    if (!trace_.empty() && planning_) {
      const bool followed = plan_ && !strayed_ && plan_->sizes.size() == trace_.size();
      if (followed) {
        followed_ = followed_since_stray_ = true;
        replans_ = strays_ = 0;
      } else if (followed_ && ++strays_ < 2) {
        // one other step (an evaluation between training steps) keeps the
        // plan: it took its buffers from the free lists. Those of a new way
        // of straying go now: kept, a next step that strays too (a graph
        // changed for good) would hold them beside the arena's pages it
        // takes again before it strays.
        if (!recurring_) {
          dropCache();
          malloc_trim(0);
        }
      } else if (++replans_ > kMaxReplans || trace_.size() >= kMaxPlanned) {
        plan_.reset();
        planning_ = false;  // until release(): the free lists serve every step
      } else {
        plan_ = std::make_shared<Plan>(trace_);
        // the free lists' blocks are what the arena replaces: held beside it
        // (or by glibc, freed), the first planned step would hold both
        dropCache();
        malloc_trim(0);
      }
    }
    if (strayed_) {
      last_stray_.clear();
      for (const TraceEntry& e : trace_) last_stray_.push_back(e.size);
      followed_since_stray_ = false;
    }
    trace_.clear();
    clock_ = 0;
    strayed_ = recurring_ = false;
    ++step_;
  }

  std::map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {{"cached_bytes", static_cast<int64_t>(cached_)},
            {"live_bytes", static_cast<int64_t>(live_)},
            {"peak_bytes", static_cast<int64_t>(peak_)},
            {"last_step_peak_bytes", static_cast<int64_t>(last_step_peak_)},
            {"planned_bytes", static_cast<int64_t>(plan_ && plan_->arena ? plan_->bytes : 0)},
            {"mapped_bytes", static_cast<int64_t>(mapped_)},
            {"group_calls", static_cast<int64_t>(calls_.load())}};
  }

 private:
  struct Block {
    c10::DataPtr base;                // the wrapped allocator's buffer (none: a plan's)
    size_t size;
    std::list<void*>::iterator lru;   // in lru_ while cached, else lru_.end()
    uint64_t freed_at;                // calls_ when it was cached
    uint64_t step = 0;                // step_ when allocated, and its index in that step
    size_t index = 0;
    std::shared_ptr<Plan> plan;       // the plan whose arena holds it
    size_t offset = 0;
    bool mapped = false;              // mapFresh()'s
  };

  void* mapFresh(size_t n) {
    void* data = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(data != MAP_FAILED, "lazy_mlir: out of memory allocating ", n, " bytes");
    Block block{c10::DataPtr(), n, lru_.end(), 0};
    block.mapped = true;
    mapped_ += n;
    blocks_.emplace(data, std::move(block));
    return data;
  }

  // The plan's buffer for the step's `index`th allocation, if the step
  // still follows the plan and its bytes are clear.
  void* fromPlan(size_t index, size_t n) {
    if (!plan_ || strayed_) return nullptr;
    if (index >= plan_->sizes.size() || plan_->sizes[index] != n) {
      // Other sizes: the rest of the step from the free lists. The plan
      // stays for the steps after (an evaluation between training steps).
      // A new way of straying (a graph changed for good, a first
      // evaluation) gives back the arena's pages no buffer of it holds, so
      // that the step holds its own buffers and the plan's live ones, not
      // the whole arena beside them; the way the last straying step went
      // (steps that take turns: gradient accumulation's last micro-batch)
      // keeps them, and its free lists serve it without page faults.
      strayed_ = true;
      recurring_ = followed_since_stray_ && last_stray_.size() >= trace_.size() &&
                   std::equal(trace_.begin(), trace_.end(), last_stray_.begin(),
                              [](const TraceEntry& e, size_t size) { return e.size == size; });
      if (!recurring_) plan_->dropUnused();
      return nullptr;
    }
    const size_t offset = plan_->offsets[index];
    if (offset == kNotPlanned || !plan_->clear(offset, n)) return nullptr;
    if (!plan_->arena) plan_->arena = base_->allocate(plan_->bytes);
    void* data = static_cast<char*>(plan_->arena.get()) + offset;
    plan_->live.emplace(offset, offset + n);
    Block block{c10::DataPtr(), n, lru_.end(), 0};
    block.plan = plan_;
    block.offset = offset;
    blocks_.emplace(data, std::move(block));
    return data;
  }

  void dropCache() {
    for (void* data : lru_) blocks_.erase(data);  // the wrapped allocator's DataPtr frees it
    lru_.clear();
    free_.clear();
    cached_ = 0;
  }

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
  //
  // Before a plan has served a whole step (a run's first steps), the bound
  // is the peak itself: the free lists of those steps are what sets the
  // run's peak resident size, and they are dropped for the arena anyway.
  void evictFor(size_t n) {
    const size_t bound = followed_ || !planning_ ? 2 * peak_ : peak_;
    while (cached_ > 0 && live_ + cached_ + n > bound) evictOldest();
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
    if (block.step == step_ && block.index < trace_.size()) trace_[block.index].freed = clock_++;
    if (block.plan) {
      block.plan->live.erase(block.offset);
      if (block.plan == plan_ && strayed_ && !recurring_) {
        block.plan->dropPages(block.offset, block.offset + block.size);
      }
      blocks_.erase(it);  // the last buffer of a replaced plan frees its arena
      return;
    }
    if (block.mapped) {
      munmap(data, block.size);
      mapped_ -= block.size;
      blocks_.erase(it);
      return;
    }
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
  size_t cached_ = 0, live_ = 0, peak_ = 0, mapped_ = 0;  // mapped_: mapFresh()'s blocks live
  size_t step_start_live_ = 0, step_peak_ = 0, last_step_peak_ = 0;  // stepEnded()'s
  std::atomic<uint64_t> calls_{0};  // group calls begun (outermost scopes): no lock on the way in
  // planning (stepEnded()): this step's allocations, the plan the last step made
  std::vector<TraceEntry> trace_;
  size_t clock_ = 0;
  uint64_t step_ = 0;
  std::shared_ptr<Plan> plan_;
  bool strayed_ = false;   // this step asked for other sizes than the plan's
  bool recurring_ = false;  // ... as the last step that strayed did, so far, with a step that followed between
  bool followed_since_stray_ = false;
  std::vector<size_t> last_stray_;  // the sizes the last step that strayed asked for
  bool followed_ = false;  // a step took its buffers from a plan (since release())
  bool planning_ = true;   // false after kMaxReplans steps in a row that did not repeat
  int replans_ = 0;
  int strays_ = 0;  // steps in a row that did not follow a plan that had been followed
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
  return {{"cached_bytes", 0}, {"live_bytes", 0}, {"peak_bytes", 0}, {"last_step_peak_bytes", 0}, {"planned_bytes", 0},
          {"mapped_bytes", 0}, {"group_calls", 0}};
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
