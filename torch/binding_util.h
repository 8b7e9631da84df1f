// torch/binding_util.h (private to torch/): the small pieces every binding file of a kernel
// family needs: q, k, v as views checked by the core (the checks themselves are the core's,
// strata/checks.h), the "bshd" / "bhsd" parser, output allocation in the memory order of an
// input, strata::Error -> c10::Error, the once-differentiable guard for autograd Functions whose
// backward is a kernel, and the Autograd kernel of the ops that are not differentiable.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <string>
#include <typeinfo>
#include <vector>

#include "strata/checks.h"
#include "strata/error.h"
#include "strata/torch/view_of.h"

namespace strata::torch::binding {

using detail::cat;

// Torch's name of a tensor's dtype ("float32", "int64", ...).
inline std::string torch_dtype_name(const at::Tensor& t) { return c10::getDtypeNames(t.scalar_type()).first; }

// q, k, v of an attention call as views, checked by the core (strata/checks.h): q's dtype among
// `allowed`, k and v of q's dtype, then check_qkv (heads as `groups` allows). d: the call's sizes.
struct QkvViews {
  TensorView q, k, v;
  AttnDims d;
};
inline QkvViews qkv_views(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Layout l,
                          const DTypes& allowed, bool self_attention = false,
                          HeadGroups groups = HeadGroups::gqa) {
  QkvViews r;
  r.q = view_of(q, where, "q", allowed);
  const DTypes same{r.q.dtype};
  r.k = view_of(k, where, "k", same, " (same as q)");
  r.v = view_of(v, where, "v", same, " (same as q)");
  r.d = check_qkv(where, r.q, r.k, r.v, l, allowed, self_attention, groups);
  return r;
}

// A boolean mask (bool or uint8, nonzero = allowed) as a uint8 view; any_device: a shape_view_of
// (for the torch-ops path's checks), else a CPU view.
inline TensorView mask_view_of(const at::Tensor& t, const char* where, const char* arg, bool any_device = false) {
  STRATA_CHECK_ARG(t.defined(), where, arg, "a defined tensor", "an undefined tensor");
  STRATA_CHECK_ARG(t.scalar_type() == at::kBool || t.scalar_type() == at::kByte, where, arg, "dtype bool or uint8",
                   torch_dtype_name(t));
  return any_device ? shape_view_of(t, where, arg, DTypes{DType::u8}, " (or bool)") : view_of(t, where, arg);
}

// shape_only_view (dtype f32) after the checks it needs, for running the core's shape checks on
// tensors the core cannot view: the pure-torch baselines, which accept any floating dtype and device.
inline TensorView shape_of(const char* where, const char* arg, const at::Tensor& t) {
  STRATA_CHECK_ARG(t.defined(), where, arg, "a defined tensor", "an undefined tensor");
  STRATA_CHECK_ARG(t.dim() <= TensorView::kMaxDims, where, arg, cat("at most ", TensorView::kMaxDims, " dims"), t.dim());
  return shape_only_view(t);
}

// The sizes of a tensor with logical dims (b, s, h, d) in layout l.
inline std::vector<int64_t> sizes_in(Layout l, int64_t b, int64_t s, int64_t h, int64_t d) {
  return l == Layout::BSHD ? std::vector<int64_t>{b, s, h, d} : std::vector<int64_t>{b, h, s, d};
}

// This machine's physical memory in bytes (0 when unknown).
inline int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

// Throws naming `arg` (the argument that makes it large) when a buffer of `sizes` elements of
// `elem_bytes` each would not fit in this machine's physical memory (or its byte count overflows
// int64): a clear error instead of the allocator's, or of a machine swapping to death. `what`
// names the buffer and its shape, e.g. "the saved state (batch x heads x (T-1) x M*B x head_dim)".
inline void check_fits_in_memory(const char* where, const char* arg, at::IntArrayRef sizes, int64_t elem_bytes,
                                 const std::string& what, int64_t arg_value) {
  int64_t bytes = elem_bytes;
  bool overflow = false;
  for (int64_t s : sizes) overflow = overflow || __builtin_mul_overflow(bytes, std::max<int64_t>(s, 0), &bytes);
  const int64_t mem = physical_memory_bytes();
  if (!overflow && (mem == 0 || bytes <= mem)) return;
  throw_arg(where, arg,
            cat("a value for which ", what, " fits in memory (",
                overflow ? std::string("over 2^63") : cat(bytes), " bytes needed, ", mem,
                " bytes of physical memory)"),
            arg_value);
}

// Parses "bshd" / "bhsd"; throws naming 'layout' otherwise.
inline Layout parse_layout(const char* where, const std::string& s) {
  if (s == "bshd") return Layout::BSHD;
  if (s == "bhsd") return Layout::BHSD;
  throw_arg(where, "layout", "\"bshd\" or \"bhsd\"", cat("\"", s, "\""));
}

inline const char* layout_name(Layout l) { return l == Layout::BSHD ? "bshd" : "bhsd"; }

// Asks Linux to back the 2 MB-aligned interior of t's storage with transparent huge pages, before
// anything touches it (returns t). For the kernels' large outputs (o, dq, dk, dv, ...): glibc maps
// an allocation of 32 MB or more afresh on every call, and filling a fresh 32 MB output took 9.6 ms
// in 4 KB pages, 3.2 ms in 2 MB pages, 1.6 ms reused (an AMD EPYC, 2 threads; an N = 256, batch
// 64 x 8 heads forward writing it takes 80-110 ms there). Outputs under 4 MB and Linux without
// THP (or with it "never") are left as they are; memory that is not fresh keeps its pages.
// STRATA_HUGE_PAGES=0 turns it off (the THP "madvise" defrag policy may compact memory at the
// fault on a fragmented machine).
inline at::Tensor with_huge_pages(at::Tensor t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool enabled = [] {
    const char* e = std::getenv("STRATA_HUGE_PAGES");
    return !(e && std::string(e) == "0");
  }();
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const size_t bytes = t.storage().nbytes();
  if (!enabled || bytes < 2 * kHuge || !t.storage().data()) return t;
  const uintptr_t a = reinterpret_cast<uintptr_t>(t.storage().data());
  const uintptr_t lo = (a + kHuge - 1) & ~(kHuge - 1), hi = (a + bytes) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only: errors ignored
#endif
  return t;
}

// A kernel's output: a strided CPU tensor with sizes `sizes`, laid out in memory in the dim order
// of `like` (as empty_like does: only when `like` is non-overlapping and dense, else contiguous),
// in huge pages when large (with_huge_pages).
inline at::Tensor empty_in_order_of(const at::Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto opt = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (!like.is_non_overlapping_and_dense() || like.dim() != int64_t(sizes.size()))
    return with_huge_pages(at::empty(sizes, opt));
  std::vector<int64_t> order(sizes.size()), strides(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  const auto ls = like.strides();
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ls[a] > ls[b]; });
  int64_t s = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[size_t(*it)] = s;
    s *= std::max<int64_t>(sizes[size_t(*it)], 1);
  }
  return with_huge_pages(at::empty_strided(sizes, strides, opt));
}

// A kernel's gradient of x: empty_like(x) (contiguous for an overlapping x such as an expand()ed
// q, whose heads each get their own gradient; autograd sums them), in huge pages when large.
inline at::Tensor empty_grad_like(const at::Tensor& x) { return with_huge_pages(at::empty_like(x)); }

// A float64 tensor with logical dims (b, s, h, d) in layout l whose memory is BSHD-contiguous:
// the order strata::reference writes its outputs in.
inline at::Tensor empty_reference_out(Layout l, int64_t b, int64_t s, int64_t h, int64_t d) {
  const auto opt = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
  if (l == Layout::BSHD) return at::empty({b, s, h, d}, opt);
  return at::empty_strided({b, h, s, d}, {s * h * d, d, h * d, 1}, opt);
}

// A copy of e whose message starts with `to` instead of `from` (when it starts with `from`): for
// errors of a core function called to validate arguments on another function's behalf.
inline Error readdressed(const Error& e, const char* from, const char* to) {
  const std::string m = e.what(), f = from;
  return Error(m.rfind(f, 0) == 0 ? cat(to, m.substr(f.size())) : m);
}

// q, k, v packed as qkv: batch x seq x 3 x heads x head_dim, with layout "bshd" (the packed ops).
inline void check_qkvpacked(const char* where, const at::Tensor& qkv, const std::string& layout) {
  STRATA_CHECK_ARG(qkv.defined() && qkv.dim() == 5 && qkv.size(2) == 3, where, "qkv",
                   "a 5-D tensor (batch, seq, 3, heads, head_dim)",
                   qkv.defined() ? cat(qkv.sizes()) : std::string("an undefined tensor"));
  STRATA_CHECK_ARG(layout == "bshd", where, "layout", "\"bshd\" (qkv is batch x seq x 3 x heads x head_dim)", layout);
}

// Runs f; rethrows a strata::Error as a c10::Error carrying the same message.
template <class F>
auto rethrow_as_c10(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The handle of the registered op `name` (e.g. "strata::attention_forward") typed with Fn, the
// signature of its kernel function (decltype(forward_op)); callers keep it in a function-local
// static (the lookup searches the dispatcher's table).
template <class Fn>
c10::TypedOperatorHandle<Fn> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Fn>();
}

// Runs f; rethrows a plain c10::Error (what a kernel op's rethrow_as_c10 made of a strata::Error)
// as a strata::Error with its message: the C++ API keeps throwing strata::Error when it reaches a
// kernel through the dispatcher (op_calls.h). Other exceptions (c10::Error subclasses, Python's
// under torch.compile's tracing) pass unchanged.
template <class F>
auto rethrow_as_strata(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    if (typeid(e) != typeid(c10::Error)) throw;
    throw Error(e.what_without_backtrace());
  }
}

// With create_graph=True the engine runs backward in grad mode, but a kernel's gradients are not
// differentiable. As Python's @once_differentiable does, route them through a DelayedError node
// so that differentiating them again raises instead of silently dropping second-order terms.
inline ::torch::autograd::variable_list once_differentiable(::torch::autograd::variable_list grads,
                                                            const ::torch::autograd::variable_list& depends_on,
                                                            const char* what) {
  if (!at::GradMode::is_enabled()) return grads;
  bool any = false;
  for (const at::Tensor& t : depends_on) any = any || (t.defined() && t.requires_grad());
  if (!any) return grads;
  for (at::Tensor& g : grads)
    if (g.defined()) g = g.detach().requires_grad_();
  auto err = std::make_shared<::torch::autograd::DelayedError>(
      cat(what, ": double backward is not supported (its backward is a kernel, differentiable once)"),
      int64_t(grads.size()));
  return (*err)(std::move(grads));
}

// The Autograd kernel of an op that is not differentiable (a forward or backward kernel alone,
// e.g. strata::attention_forward): runs the op below autograd, so its outputs never require
// grad, whatever its inputs (as argmax's). Without an Autograd kernel the dispatcher's fallback
// marks the outputs as requiring grad, and a backward through them silently leaves the inputs
// without a gradient. Register with m.impl(name, binding::non_differentiable()) in a
// TORCH_LIBRARY_IMPL(strata, Autograd, m) block.
inline void non_differentiable_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                      ::torch::jit::Stack* stack) {
  at::AutoDispatchBelowADInplaceOrView guard;
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}
inline ::torch::CppFunction non_differentiable() {
  return ::torch::CppFunction::makeFromBoxedFunction<&non_differentiable_kernel>();
}

}  // namespace strata::torch::binding
