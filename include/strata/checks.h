// strata/checks.h: the argument checks every kernel family shares. The kernels' entry points, the
// decode cache, the double references and the LibTorch bindings all call these (and each family's
// validate(options)), so a bad input gets the same error whichever way it comes in: a
// strata::Error naming the argument, what was expected and what came.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/error.h"
#include "strata/tensor.h"

namespace strata {

// The logical sizes of one attention call (whatever the layout).
// Heads: one of heads_q, heads_kv divides the other. heads_q % heads_kv == 0 is GQA / MQA (each kv
// head serves heads_q / heads_kv query heads); heads_kv % heads_q == 0 (only where the family
// accepts it, see HeadGroups) is its mirror, a shared query (each query head serves
// heads_kv / heads_q kv heads). The output (o, lse, dout) has heads() = the larger count; output
// head h reads query head h / (heads() / heads_q) and kv head h / (heads() / heads_kv).
struct AttnDims {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  DType dtype = DType::f32;  // of q, k, v (and o and the gradients)
  int64_t heads() const { return heads_q > heads_kv ? heads_q : heads_kv; }  // of o, lse, dout
};

// Which head counts of q and k an attention family accepts (AttnDims says what they mean).
enum class HeadGroups {
  gqa,              // heads_q % heads_kv == 0
  gqa_or_shared_q,  // that, or heads_kv % heads_q == 0 (a query shared by groups of kv heads)
};

// A set of dtypes an argument may have.
class DTypes {
 public:
  DTypes(std::initializer_list<DType> ts) {
    for (DType t : ts) bits_ |= 1u << unsigned(t);
  }
  bool has(DType t) const { return (bits_ >> unsigned(t)) & 1u; }
  std::string names() const;  // e.g. "float32 or bfloat16"

 private:
  unsigned bits_ = 0;
};

// What the kernels compute in (fp32 math, fp32 or bf16 storage), and what the double references
// also read (float64, for finite differences and torch's float64 path).
inline const DTypes kKernelDTypes{DType::f32, DType::bf16};
inline const DTypes kReferenceDTypes{DType::f32, DType::bf16, DType::f64};

// Sequence lengths stay below 2^24: the kernels compare positions in fp32 lanes, exact up to there.
inline constexpr int64_t kMaxSeqLen = int64_t(1) << 24;

// q, k, v of an attention call in `layout` (any strides): each 4-D with sizes >= 0 and data (or
// empty); q's dtype among `dtypes` and k, v of q's dtype; head_dim, head_dim_v, heads >= 1;
// heads as `groups` allows (an error names 'k'); k of q's batch and head_dim, v of k's batch, seq and heads.
// self_attention: k must also have q's seq.
AttnDims check_qkv(const char* where, const TensorView& q, const TensorView& k, const TensorView& v, Layout layout,
                   const DTypes& dtypes, bool self_attention = false, HeadGroups groups = HeadGroups::gqa);

// Query and key sequences below kMaxSeqLen, for kernels that compare positions in fp32 lanes;
// keys_note is appended to the key's message (e.g. what bounds the keys counted).
void check_positions(const char* where, int64_t seqlen_q, int64_t seqlen_k, const char* keys_note = "");

// A 4-D argument of dtype `dtype` with logical dims (b, s, h, d) in `layout`; s < 0 accepts any
// seq. `why` says where the expected dims come from, e.g. "(q's batch, seq, heads; v's head_dim)".
void check_4d(const char* where, const char* arg, const TensorView& t, Layout layout, DType dtype, int64_t b,
              int64_t s, int64_t h, int64_t d, const char* why);

// An output a kernel writes: no two of its elements share memory (a stride-0 or otherwise
// overlapping view, e.g. torch's expand(), would have its rows written over one another). The
// dense family calls it on o, lse, dq, dk, dv after its other checks.
void check_no_overlap(const char* where, const char* arg, const TensorView& t);

// The output o of an attention call: (batch, seqlen_q, d.heads(), head_dim_v), q's dtype.
void check_out(const char* where, const TensorView& o, Layout layout, const AttnDims& d);

// lse: [batch, d.heads(), seqlen_q], float32, any strides.
void check_lse(const char* where, const TensorView& lse, const AttnDims& d);

// The gradients of a backward: dout like o, dq like q, dk like k, dv like v, all of q's dtype. Their
// elements must not overlap (check_no_overlap: they are written).
void check_grads(const char* where, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                 const TensorView& dv, Layout layout, const AttnDims& d);

// An optional key padding mask (undefined: none): [batch, seq] uint8, nonzero = key allowed.
void check_key_padding_mask(const char* where, const TensorView& m, int64_t batch, int64_t seq);

// True when an optional tensor argument was given (data or dims set).
inline bool given(const TensorView& t) { return t.data != nullptr || t.ndim != 0; }

// ---- Value scans (the finite-input bound of strata/attention.h) -----------------------------
// One pass each over a float32 or bfloat16 view of any rank and strides (other dtypes: an error).
// Whether every element is finite.
bool all_finite(const TensorView& t);
// The largest Euclidean norm of t's rows along its last dim (in double; 0 for an empty view).
double max_row_norm(const TensorView& t);
// The largest |x| over t's finite elements (0 when it has none).
double max_finite_abs(const TensorView& t);

}  // namespace strata
