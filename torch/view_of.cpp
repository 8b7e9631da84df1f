// torch/view_of.cpp: at::Tensor -> strata::TensorView (strata/torch/view_of.h).
#include "strata/torch/view_of.h"

#include <c10/util/Exception.h>

#include <string>

#include "strata/error.h"

namespace strata::torch {
namespace {

// Torch's name of a tensor's dtype ("float32", "int64", ...).
std::string torch_dtype_name(const at::Tensor& t) { return c10::getDtypeNames(t.scalar_type()).first; }

// The TensorView dtype of a torch dtype; false when a view cannot hold it.
bool dtype_of(at::ScalarType s, DType* out) {
  switch (s) {
    case at::kFloat: *out = DType::f32; return true;
    case at::kBFloat16: *out = DType::bf16; return true;
    case at::kDouble: *out = DType::f64; return true;
    case at::kByte: *out = DType::u8; return true;
    case at::kBool: *out = DType::u8; return true;  // torch bool is one byte holding 0 or 1
    default: return false;
  }
}

}  // namespace

TensorView view_of(const at::Tensor& t, const char* arg) { return view_of(t, "view_of", arg); }

TensorView view_of(const at::Tensor& t, const char* where, const char* arg) {
  return view_of(t, where, arg, DTypes{DType::f32, DType::bf16, DType::f64, DType::u8}, " (or bool)");
}

TensorView shape_only_view(const at::Tensor& t) {
  static double unread;  // the data of every shape-only view
  TensorView v;
  v.data = &unread;
  v.ndim = int(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

DType checked_dtype(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed, const char* note) {
  STRATA_CHECK_ARG(t.defined(), where, arg, "a defined tensor", "an undefined tensor");
  DType dtype = DType::f32;
  const bool representable = dtype_of(t.scalar_type(), &dtype);
  STRATA_CHECK_ARG(representable && allowed.has(dtype), where, arg, detail::cat("dtype ", allowed.names(), note),
                   torch_dtype_name(t));
  return dtype;
}

// view_of's checks (the device's only when `on_cpu`) and the view.
static TensorView checked_view(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                        const char* note, bool on_cpu) {
  TensorView v;
  v.dtype = checked_dtype(t, where, arg, allowed, note);
  if (on_cpu)
    STRATA_CHECK_ARG(t.device().is_cpu(), where, arg, "a CPU tensor", detail::cat("a tensor on ", t.device().str()));
  STRATA_CHECK_ARG(t.layout() == at::kStrided, where, arg, "a strided (dense) tensor",
                   detail::cat("layout ", t.layout()));
  STRATA_CHECK_ARG(!t.is_neg(), where, arg, "a tensor without a lazy negation bit (call resolve_neg())",
                   "a negative view");
  STRATA_CHECK_ARG(t.dim() <= TensorView::kMaxDims, where, arg,
                   detail::cat("at most ", TensorView::kMaxDims, " dims"), t.dim());
  const DType dtype = v.dtype;
  v = shape_only_view(t);
  v.dtype = dtype;
  if (on_cpu) v.data = t.numel() == 0 ? nullptr : t.data_ptr();
  return v;
}

TensorView view_of(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed, const char* note) {
  return checked_view(t, where, arg, allowed, note, /*on_cpu=*/true);
}

TensorView shape_view_of(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                         const char* note) {
  return checked_view(t, where, arg, allowed, note, /*on_cpu=*/false);
}

}  // namespace strata::torch
