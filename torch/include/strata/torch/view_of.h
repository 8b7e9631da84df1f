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

// view_of's checks but the device's, on a tensor of any device: a view whose data pointer is a
// placeholder never to be read, for running the core's checks (shapes, dtypes, options) in front of
// code that computes with ATen ops (the torch-ops path, strata/torch/torch_ops.h).
TensorView shape_view_of(const at::Tensor& t, const char* where, const char* arg, const DTypes& allowed,
                         const char* note = "");

}  // namespace strata::torch
