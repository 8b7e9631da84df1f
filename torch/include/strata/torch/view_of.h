// strata/torch/view_of.h: at::Tensor -> strata::TensorView (no copy), the bridge between LibTorch
// tensors and the torch-free core.
#pragma once
#include <ATen/ATen.h>

#include "strata/checks.h"  // DTypes
#include "strata/tensor.h"

namespace strata::torch {

// Wraps a CPU strided tensor as a TensorView (no copy). Throws strata::Error naming `arg` for an
// undefined, non-CPU, non-strided or lazily negated tensor, or a dtype a TensorView cannot hold
// (float32, bfloat16, float64, uint8 and bool, viewed as uint8).
TensorView view_of(const at::Tensor& t, const char* arg);
// Same, with `where` (the calling function's name) leading the error message.
TensorView view_of(const at::Tensor& t, const char* where, const char* arg);
// Same, accepting only the dtypes in `allowed` ("expected dtype <allowed><note>, got int32").
TensorView view_of(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                   const char* note = "");

// Checks that t is defined and of a dtype in `allowed` (the message view_of gives); reads neither
// its sizes nor its data, so it also holds for the fake and symbolic-size tensors of torch.compile's
// tracing. Returns the TensorView dtype.
DType checked_dtype(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                    const char* note = "");

// t's sizes and strides (t.dim() <= TensorView::kMaxDims, checked by the caller) over a data
// pointer that is non-null (the core's checks reject null data for a non-empty tensor) and never
// dereferenced: a view for running the core's shape checks on tensors it will not read.
TensorView shape_only_view(const at::Tensor& t);

// view_of's checks but the device's, on a tensor of any device: a shape_only_view with t's dtype,
// for running the core's checks (shapes, dtypes, options) in front of code that computes with ATen
// ops (the torch-ops path, strata/torch/torch_ops.h).
TensorView shape_view_of(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                         const char* note = "");

}  // namespace strata::torch
