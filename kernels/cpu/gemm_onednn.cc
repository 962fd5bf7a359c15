#include "kernels/cpu/gemm_onednn.h"

#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "common/check.h"

// libgomp's, which oneDNN's OpenMP runtime reads; declared here rather than
// through <omp.h>, which not every compiler ships without -fopenmp.
extern "C" void omp_set_num_threads(int);

namespace gridsync::cpu::onednn {
namespace {

using dnnl::memory;

// Everything that shapes a primitive. A worker's batch is cut into chunks
// of one size plus a tail, so a run makes a handful of them.
struct Key {
  int m, n, k, lda, ldb, ldc;
  bool ta, tb, accumulate;
  MatmulFormat format;
  bool bf16_dst = false;  // dst = bf16(sum) instead of fp32 sums
  bool relu = false;      // ... of ReLU(sum)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = 0;
    for (int v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc, int(key.ta), int(key.tb),
                  int(key.accumulate), int(key.format), int(key.bf16_dst), int(key.relu)})
      h = h * 1000003u ^ std::hash<int>()(v);
    return h;
  }
};

struct Primitive {
  dnnl::matmul matmul;
  memory::desc src, weights, dst, scratchpad;
  std::string impl;  // oneDNN's name for the implementation it chose
};

// Beyond this many shapes (a run whose batches change size every step: the
// tail chunk's width moves) one entry makes room for each new one, so the
// cache stays bounded and the chunks' shapes mostly stay.
constexpr size_t kMaxPrimitives = 256;

// oneDNN's OpenMP runtime would start a team of every core inside each of
// our pool's threads; one thread per call leaves the parallelism to the
// pool. The setting is per calling thread (libgomp keeps it per thread).
void OneThreadHere() {
  thread_local bool set = false;
  if (!set) {
    omp_set_num_threads(1);
    set = true;
  }
}

dnnl::engine* EngineOrNull() {
  static std::unique_ptr<dnnl::engine> engine = []() -> std::unique_ptr<dnnl::engine> {
    try {
      if (dnnl::engine::get_count(dnnl::engine::kind::cpu) == 0) return nullptr;
      return std::make_unique<dnnl::engine>(dnnl::engine::kind::cpu, 0);
    } catch (const dnnl::error&) {
      return nullptr;
    }
  }();
  return engine.get();
}

memory::data_type Type(MatmulFormat format) {
  return format == MatmulFormat::kBf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// oneDNN's matmul is row-major: dst (N x M) = src (N x K) * weights (K x M).
// A column-major C = op(A) op(B) is the row-major C^T = op(B)^T op(A)^T, and
// every transpose is only a choice of strides.
Primitive Make(const Key& key) {
  OneThreadHere();
  const memory::dim m = key.m, n = key.n, k = key.k;
  Primitive p;
  // src(j, kk) = op(B)(kk, j): stored B(kk, j) at kk + j*ldb, or B(j, kk).
  p.src = memory::desc({n, k}, Type(key.format),
                       key.tb ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  // weights(kk, i) = op(A)(i, kk): stored A(i, kk) at i + kk*lda, or A(kk, i).
  p.weights = memory::desc({k, m}, Type(key.format),
                           key.ta ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  // dst(j, i) = C(i, j) at i + j*ldc.
  p.dst = memory::desc({n, m}, key.bf16_dst ? memory::data_type::bf16 : memory::data_type::f32,
                       memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (key.accumulate) ops.append_sum(1.0f);
  // The ReLU, and the rounding to the bf16 dst, in the kernel's epilogue.
  if (key.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.src, p.weights, p.dst), attr,
                                  *EngineOrNull());
  p.scratchpad = pd.scratchpad_desc();
  p.impl = pd.impl_info_str();
  p.matmul = dnnl::matmul(pd);
  return p;
}

class PrimitiveCache {
 public:
  // The primitive for `key`, made on first use; null where oneDNN has none.
  std::shared_ptr<const Primitive> Get(const Key& key) {
    {
      std::shared_lock lock(mu_);
      auto it = primitives_.find(key);
      if (it != primitives_.end()) return it->second;
    }
    std::shared_ptr<const Primitive> made;
    try {
      made = std::make_shared<const Primitive>(Make(key));
      // oneDNN's reference code is many times slower than Eigen.
      if (made->impl.rfind("ref", 0) == 0) made = nullptr;
    } catch (const dnnl::error&) {
      made = nullptr;  // unimplemented here: Eigen serves this shape
    }
    std::unique_lock lock(mu_);
    if (primitives_.size() >= kMaxPrimitives && primitives_.find(key) == primitives_.end())
      primitives_.erase(primitives_.begin());
    return primitives_.emplace(key, std::move(made)).first->second;
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Primitive>, KeyHash> primitives_;
};

PrimitiveCache& Cache() {
  static PrimitiveCache cache;
  return cache;
}

// The calling thread's stream and scratchpad, and the transposed product
// of ExecuteFewRows.
struct ThreadState {
  dnnl::stream stream{*EngineOrNull()};
  std::vector<uint8_t> scratchpad;
  std::vector<float> transposed;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

// Runs the primitive for `key` on operands at a and b (fp32 or bf16, as the
// key's format says); false where oneDNN has none for it.
bool Execute(const Key& key, const void* a, const void* b, void* c) {
  OneThreadHere();
  const std::shared_ptr<const Primitive> p = Cache().Get(key);
  if (p == nullptr) return false;
  ThreadState& state = State();
  const size_t scratchpad_bytes = p->scratchpad.get_size();
  if (state.scratchpad.size() < scratchpad_bytes) state.scratchpad.resize(scratchpad_bytes);
  dnnl::engine& engine = *EngineOrNull();
  // Arguments of the descriptors made above: oneDNN throws here only on a
  // bug of ours, and C may then be half written, so it is not recoverable.
  try {
    memory src(p->src, engine, const_cast<void*>(b));
    memory weights(p->weights, engine, const_cast<void*>(a));
    memory dst(p->dst, engine, c);
    memory scratchpad(p->scratchpad, engine, state.scratchpad.data());
    p->matmul.execute(state.stream, {{DNNL_ARG_SRC, src},
                                     {DNNL_ARG_WEIGHTS, weights},
                                     {DNNL_ARG_DST, dst},
                                     {DNNL_ARG_SCRATCHPAD, scratchpad}});
    state.stream.wait();
  } catch (const dnnl::error& e) {
    ::gridsync::internal::CheckFailed(__FILE__, __LINE__, e.what());
  }
  return true;
}

// A C of at most this many rows, from a product of at least this many
// terms a value, is computed as its transpose (ExecuteFewRows).
constexpr int kFewRows = 8;
constexpr int kFewRowsMinTerms = 256;

// oneDNN's kernels vectorise along the columns of their row-major dst,
// which are C's rows: a C of a few rows (the MLP's output layer, 3 for an
// image) filled 3 of 16 lanes, and its products ran at a sixth to a tenth of
// the hidden layers' rate (on 2048 samples, dW of the output layer 22 us in
// bf16 and 33 us in fp32 against 9.5 and 7 us as the transpose). So such a
// product is computed as C^T = op(B)^T op(A)^T (n x m, the same dot
// products), into the thread's scratch, then transposed into C (plus C
// when accumulating). Only the order of a dot product's sums may differ.
// The transposition moves every value of C once, which only a long product
// (a weight gradient, summed over the chunk's samples) repays: the output
// layer's forward product, 3 x 2048 of 64 terms, took as long either way.
bool ExecuteFewRows(const Key& key, const void* a, const void* b, float* c) {
  const Key flipped{
      key.n,     key.m, key.k, key.ldb, key.lda, key.n, !key.tb, !key.ta, /*accumulate=*/false,
      key.format};
  std::vector<float>& t = State().transposed;
  t.resize(size_t(key.m) * size_t(key.n));
  if (!Execute(flipped, b, a, t.data())) return false;
  // t(j, i) = C(i, j), at j + i*n.
  for (int j = 0; j < key.n; ++j) {
    float* col = c + size_t(j) * size_t(key.ldc);
    for (int i = 0; i < key.m; ++i) {
      const float v = t[size_t(j) + size_t(i) * size_t(key.n)];
      col[i] = key.accumulate ? col[i] + v : v;
    }
  }
  return true;
}

bool ExecuteFp32Dst(const Key& key, const void* a, const void* b, float* c) {
  if (key.m <= kFewRows && key.k >= kFewRowsMinTerms) return ExecuteFewRows(key, a, b, c);
  return Execute(key, a, b, c);
}

}  // namespace

bool Available() { return EngineOrNull() != nullptr; }

bool NativeBf16() {
  static const bool native = [] {
    if (!Available()) return false;
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  }();
  return native;
}

std::string EngineName(MatmulFormat format) {
  const dnnl_version_t* v = dnnl_version();
  std::string name = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                     std::to_string(v->patch);
  // The implementation a chunk of the MLP's forward pass gets, from the
  // cache the products use (so a refused reference kernel shows as such).
  const Key probe{64, 2048, 64, 64, 64, 64, false, false, false, format};
  const std::shared_ptr<const Primitive> p = Cache().Get(probe);
  return name + (p != nullptr ? " (" + p->impl + ")" : " (no fast kernel: Eigen serves)");
}

bool Gemm(int m, int n, int k, const GemmOperand& a, const GemmOperand& b, float* c, int ldc,
          bool accumulate) {
  const Key key{
      m, n, k, a.ld, b.ld, ldc, a.transposed, b.transposed, accumulate, MatmulFormat::kFp32};
  return ExecuteFp32Dst(key, a.data, b.data, c);
}

bool GemmBf16(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, float* c, int ldc,
              bool accumulate) {
  const Key key{
      m, n, k, a.ld, b.ld, ldc, a.transposed, b.transposed, accumulate, MatmulFormat::kBf16};
  return ExecuteFp32Dst(key, a.data, b.data, c);
}

bool GemmBf16Out(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, uint16_t* c,
                 int ldc, bool relu) {
  const Key key{m,
                n,
                k,
                a.ld,
                b.ld,
                ldc,
                a.transposed,
                b.transposed,
                /*accumulate=*/false,
                MatmulFormat::kBf16,
                /*bf16_dst=*/true,
                relu};
  return Execute(key, a.data, b.data, c);
}

}  // namespace gridsync::cpu::onednn
